"""Replay's triage stages on Python classifiers (torchvision's resnet18 and a small
VisionTransformer, vision_models.py): the data and objective stages on a batch of one class per
sample, and the optimizer stage on a torch.optim AdamW/Adam step recorded through
Monitor.attach_optimizer. Run by ctest (python_tests)."""
import json
import pathlib
import re
import subprocess
import sys

import pytest
import torch

import capsule
from test_capsule import CLI, keys  # noqa: F401 (keys: a fixture)

pytest.importorskip("torchvision")
HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import vision_models  # noqa: E402
from test_vision import batch, replay  # noqa: E402


def stage(d, name):
    return next(s for s in d["stages"] if s["stage"] == name)


def failed(d, *names):
    return [f for n in names for f in stage(d, n).get("findings", []) if f.get("failed")]


def capture_step(tmp_path, keys, config, b, trainer_loss_times=1.0):
    """One classifier step captured by hand; returns the capsule's path."""
    net = vision_models.make(config)
    monitor = capsule.Monitor(capsule_dir=str(tmp_path / "caps"), signing_key=str(keys[0]),
                              log_sink=lambda line: None)
    monitor.attach(vision_models.model_of(net, config))
    with monitor.step(0, batch=b) as s:
        loss = vision_models.loss_of(config)(net(b["inputs"]), b)
        loss.backward()
        s.end(loss=trainer_loss_times * loss.item())
        report = s.capture_now("look at this step")
    assert report["capsule_path"], report
    return report["capsule_path"]


def classification_batch(**declared):
    return batch(objective="classification", **declared)


@pytest.mark.parametrize("arch", ["resnet18", "vit"])
def test_a_clean_classification_step_passes_the_data_and_objective_stages(tmp_path, keys, arch):
    cap = capture_step(tmp_path, keys, {"arch": arch}, classification_batch())
    _, d = replay(cap, keys)
    for name in ("STAGE_DATA", "STAGE_OBJECTIVE"):
        assert stage(d, name).get("ran"), stage(d, name)
    assert failed(d, "STAGE_DATA", "STAGE_OBJECTIVE") == []
    checks = {f["check"] for f in stage(d, "STAGE_OBJECTIVE")["findings"]}
    # The trainer's loss (FP32, BatchNorm on batch statistics) and the model's FP64 loss, each
    # against the hand-written cross-entropy.
    assert {"objective.loss_matches", "objective.trainer_loss_matches"} <= checks


def test_a_target_outside_the_classes_is_named(tmp_path, keys):
    b = classification_batch()
    b["labels"][2] = 10  # of 10 classes: [0, 10)
    cap = capture_step(tmp_path, keys, {"arch": "resnet18", "loss": "clamped"}, b)
    _, d = replay(cap, keys)
    bad = failed(d, "STAGE_DATA")
    assert [(f["check"], f.get("sample_index")) for f in bad] == [
        ("data.label_out_of_range", 2)], bad
    assert "target class 10, outside the model's 10 classes" in bad[0]["detail"]


def test_a_non_finite_input_is_named(tmp_path, keys):
    b = classification_batch()
    b["inputs"][1, 0, 5, 5] = float("nan")
    cap = capture_step(tmp_path, keys, {"arch": "resnet18"}, b)
    _, d = replay(cap, keys)
    bad = failed(d, "STAGE_DATA")
    assert [(f["check"], f.get("sample_index")) for f in bad] == [
        ("data.non_finite_input", 1)], bad


def test_a_trainer_loss_twice_the_declared_mean_is_named(tmp_path, keys):
    cap = capture_step(tmp_path, keys, {"arch": "resnet18"}, classification_batch(),
                       trainer_loss_times=2.0)
    _, d = replay(cap, keys)
    bad = {f["check"]: f for f in failed(d, "STAGE_OBJECTIVE")}
    assert "objective.trainer_loss_matches" in bad, stage(d, "STAGE_OBJECTIVE")
    assert "objective.loss_matches" not in bad  # the model's own loss is right
    assert bad["objective.unexplained"]["value"] == pytest.approx(2.0, rel=1e-4)


def test_a_declared_label_smoothing_is_held_to(tmp_path, keys):
    # The trainer declares label smoothing 0.1 and its loss applies none.
    cap = capture_step(tmp_path, keys, {"arch": "resnet18"},
                       classification_batch(label_smoothing=0.1))
    _, d = replay(cap, keys)
    bad = {f["check"] for f in failed(d, "STAGE_OBJECTIVE")}
    assert {"objective.loss_matches", "objective.label_smoothing"} <= bad, bad


def optimizer_capture(tmp_path, keys, make_opt, optimizer_step=None, steps=2):
    """`steps` steps of a small ViT under `make_opt`, the last captured with its optimizer step,
    which `optimizer_step(net, opt)` takes in place of opt.step() when given."""
    config = {"arch": "vit"}
    net = vision_models.make(config)
    monitor = capsule.Monitor(capsule_dir=str(tmp_path / "caps"), signing_key=str(keys[0]),
                              log_sink=lambda line: None)
    monitor.attach(vision_models.model_of(net, config))
    opt = make_opt(net.parameters())
    probe = monitor.attach_optimizer(opt, net.named_parameters())
    for step in range(steps):
        b = batch(step)
        opt.zero_grad()
        with monitor.step(step, batch=b) as s:
            loss = torch.nn.functional.cross_entropy(net(b["inputs"]), b["labels"])
            loss.backward()
            s.end(loss=loss)
            if step == steps - 1:
                assert s.capture_now("look at this step")["pending"]
        probe.before_step()
        if optimizer_step is not None and step == steps - 1:
            optimizer_step(net, opt)
        else:
            opt.step()
        report = probe.after_step()
    assert report["capsule_path"], report
    return report["capsule_path"]


@pytest.mark.parametrize("make_opt", [
    lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.05),
    lambda p: torch.optim.Adam(p, lr=1e-3, weight_decay=0.01, maximize=True),
], ids=["adamw", "adam-maximize"])
def test_a_clean_torch_optim_step_is_redone_exactly(tmp_path, keys, make_opt):
    cap = optimizer_capture(tmp_path, keys, make_opt)
    _, d = replay(cap, keys)
    opt = stage(d, "STAGE_OPTIMIZER")
    assert opt.get("ran"), opt
    assert [f for f in opt["findings"] if f.get("failed")] == [], opt
    match = next(f for f in opt["findings"] if f["check"] == "optimizer.update_matches")
    assert "equals a hand-written FP64" in match["detail"], match


def test_an_update_the_recorded_adamw_does_not_make_is_named(tmp_path, keys):
    def lr_times_100(net, opt):  # the head's weight moves 100 times as far as AdamW takes it
        w = net.heads.head.weight
        before = w.detach().clone()
        opt.step()
        with torch.no_grad():
            w.add_(99 * (w - before))

    cap = optimizer_capture(tmp_path, keys, lambda p: torch.optim.AdamW(p, lr=1e-3),
                            optimizer_step=lr_times_100)
    _, d = replay(cap, keys)
    bad = [f for f in stage(d, "STAGE_OPTIMIZER")["findings"] if f.get("failed")]
    assert [f["check"] for f in bad] == ["optimizer.update_matches"], bad
    assert "parameter of heads.head.weight" in bad[0]["detail"], bad[0]["detail"]


def test_an_optimizer_that_is_not_adam_is_refused_and_says_so(tmp_path, keys):
    with pytest.warns(UserWarning, match="torch.optim.SGD is not captured: only"):
        cap = optimizer_capture(tmp_path, keys, lambda p: torch.optim.SGD(p, lr=0.01))
    info = json.loads(subprocess.run([CLI, "inspect", str(cap), "--pubkey", str(keys[1]),
                                      "--json"], capture_output=True, text=True,
                                     check=True).stdout)
    assert info["optimizer"]["kind"] == "OTHER_OPTIMIZER"
    assert info["optimizer"]["optimizer_class"] == "torch.optim.SGD"
    assert any("torch.optim.SGD is not captured" in n for n in info["capture_notes"])
    _, d = replay(cap, keys)
    match = next(f for f in stage(d, "STAGE_OPTIMIZER")["findings"]
                 if f["check"] == "optimizer.update_matches")
    assert not match.get("failed") and "not redone" in match["detail"], match


def test_the_readme_classifier_loop_records_the_adamw_step(tmp_path, keys):
    text = (HERE.parents[1] / "README.md").read_text()
    section = text[text.index("A classifier's batch declares itself"):]
    snippet = re.search(r"```python\n(.*?)\n```", section, re.S).group(1)
    net = vision_models.make({"arch": "vit"})
    batches = [(b["inputs"], b["labels"]) for b in (batch(i) for i in range(3))]
    with torch.no_grad():  # the last batch's labels: the classes the model finds least likely
        images = batch(3)["inputs"]
        batches.append((images, net(images).argmin(1)))
    env = {"net": net, "config": {"arch": "vit"}, "batches": batches, "capsule_dir": str(tmp_path / "readme"),
           "key": str(keys[0]), "optimizer": torch.optim.AdamW(net.parameters(), lr=1e-3),
           # A rule that fires on the argmin batch after three steps: no trend, no floor in nats.
           "spike_rule": {"window": 3, "warmup": 3, "mads": 0.0, "min_ratio": 1.15,
                          "detrend": False, "min_rise": 0.0, "max_rise": 0.0}}
    exec(compile(snippet, "README.md (classifier)", "exec"), env)
    assert env["monitor"].capsules_written == 1
    cap = env["written"]["capsule_path"]
    _, d = replay(cap, keys)
    opt = stage(d, "STAGE_OPTIMIZER")
    assert opt.get("ran") and not opt.get("explains"), opt
    assert failed(d, "STAGE_DATA", "STAGE_OBJECTIVE") == []
