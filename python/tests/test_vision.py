"""The Python path on models this project did not write: torchvision's resnet18 (float image
inputs, BatchNorm buffers, ReLU(inplace=True)) and a small VisionTransformer (a class token and a
position embedding that belong to no submodule). Each test holds one defect that an outside trial
found to its fix; run by ctest (python_tests)."""
import json
import os
import pathlib
import subprocess
import sys
import warnings

import pytest
import torch

import capsule
from test_capsule import CLI, keys  # noqa: F401 (keys: a fixture)

torchvision = pytest.importorskip("torchvision")
HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import vision_models  # noqa: E402


batch = vision_models.batch


def capture(tmp_path, keys, config, steps=2, eval_mode=False, monitor_args=None):
    """Trains `steps` SGD steps and captures the last by hand; returns (capsule, net, monitor)."""
    net = vision_models.make(config)
    if eval_mode:
        net.eval()
    model = vision_models.model_of(net, config)
    monitor = capsule.Monitor(capsule_dir=str(tmp_path / "caps"), signing_key=str(keys[0]),
                              log_sink=lambda line: None, **(monitor_args or {}))
    monitor.attach(model)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    for step in range(steps):
        b = batch(step)
        opt.zero_grad()
        with monitor.step(step, batch=b) as s:
            loss = torch.nn.functional.cross_entropy(net(b["inputs"]), b["labels"])
            loss.backward()
            s.end(loss=loss)
            if step == steps - 1:
                report = s.capture_now("look at this step")
                assert report["capsule_path"], report
        if step < steps - 1:
            opt.step()
    return pathlib.Path(report["capsule_path"]), net, monitor


def replay(cap, keys, *args):
    env = dict(os.environ, PYTHONPATH=f"{HERE}:{os.environ.get('PYTHONPATH', '')}")
    r = subprocess.run([sys.executable, "-m", "capsule", "replay", str(cap), "--model",
                        "vision_models:factory", "--pubkey", str(keys[1]), "--json", *args],
                       capture_output=True, text=True, env=env)
    assert r.stdout, r.stderr
    return r.returncode, json.loads(r.stdout)


@pytest.mark.parametrize("arch", ["resnet18", "vit"])
def test_a_clean_float_input_model_replays_exactly_with_no_divergence(tmp_path, keys, arch):
    # Float images against the float64 reference copy ("expected scalar type Double"), and
    # resnet's in-place ReLU, which overwrote bn1's recorded output (bn1 2.4e5x over tolerance).
    cap, _, _ = capture(tmp_path, keys, {"arch": arch})
    rc, d = replay(cap, keys, "--bisect", "--phase", "both")
    assert rc == 0, d.get("diagnosis_text")
    assert d["diagnosis"] == "NO_DIVERGENCE" and d["fidelity"] == "REPRODUCED_EXACT", d
    assert all(l["verdict"] == "OK" for l in d["layers"]), [l for l in d["layers"]
                                                           if l["verdict"] != "OK"]


def test_an_eval_mode_model_replays_on_its_running_statistics(tmp_path, keys):
    # Without the buffers and the mode in the capsule, replay ran batch statistics on fresh
    # running statistics: a false TRANSIENT.
    cap, net, _ = capture(tmp_path, keys, {"arch": "resnet18"}, eval_mode=True)
    info = json.loads(subprocess.run([CLI, "inspect", str(cap), "--pubkey", str(keys[1]),
                                      "--json"], capture_output=True, text=True,
                                     check=True).stdout)
    buffers = {t["name"] for t in info["tensors"] if t.get("role") == "BUFFER"}
    assert {"bn1.running_mean", "bn1.running_var", "layer4.1.bn2.running_var"} <= buffers
    assert info["data"].get("eval_mode") is True
    rc, d = replay(cap, keys)
    assert d["fidelity"] == "REPRODUCED_EXACT", d["fidelity_detail"]
    assert rc == 0 and d["diagnosis"] == "NO_DIVERGENCE", d.get("diagnosis_text")


def test_a_state_dict_checkpoint_with_batchnorm_buffers_is_the_steps_weights(tmp_path, keys):
    # model.state_dict() holds the running statistics beside the parameters: the capture called
    # such a checkpoint "not this step's weights" and replay refused it as another model's.
    config = {"arch": "resnet18"}
    net = vision_models.make(config)
    net.eval()
    ckpt = tmp_path / "resnet18.pt"
    torch.save(net.state_dict(), ckpt)
    monitor = capsule.Monitor(capsule_dir=str(tmp_path / "caps"), signing_key=str(keys[0]),
                              weight_policy="anomalous_layer", log_sink=lambda line: None)
    monitor.set_weights_checkpoint(str(ckpt))
    monitor.attach(vision_models.model_of(net, config))
    b = batch()
    with monitor.step(0, batch=b) as s:
        loss = torch.nn.functional.cross_entropy(net(b["inputs"]), b["labels"])
        loss.backward()
        s.end(loss=loss)
        report = s.capture_now("look at this step")
    info = json.loads(subprocess.run([CLI, "inspect", report["capsule_path"], "--pubkey",
                                      str(keys[1]), "--json"], capture_output=True, text=True,
                                     check=True).stdout)
    ref = info["model"]["weights_reference"]
    assert ref["matches_step"] is True, info.get("capture_notes")
    buffers = {t["name"] for t in ref["tensors"] if t.get("buffer")}
    assert {"bn1.running_mean", "bn1.num_batches_tracked"} <= buffers
    assert "conv1.weight" not in buffers
    rc, d = replay(report["capsule_path"], keys)
    assert d["fidelity"] == "REPRODUCED_EXACT", (d["fidelity_detail"], d.get("diagnosis_text"))
    assert rc == 0 and d["diagnosis"] == "NO_DIVERGENCE", d.get("diagnosis_text")
    # Running statistics that are not the step's are named, as a parameter would be.
    state = net.state_dict()
    state["layer2.0.bn1.running_var"] = state["layer2.0.bn1.running_var"] * 2
    torch.save(state, ckpt)
    rc, d = replay(report["capsule_path"], keys, "--force")
    assert "layer2.0.bn1.running_var" in " ".join(d.get("warnings", [])), d.get("warnings")


def test_a_capture_leaves_batchnorm_state_as_an_unarmed_twin_has_it(tmp_path, keys):
    # The capture re-run in training mode moved the running statistics (60 of 122 entries).
    armed, net, _ = capture(tmp_path, keys, {"arch": "resnet18"}, steps=3)
    twin = vision_models.make({"arch": "resnet18"})
    opt = torch.optim.SGD(twin.parameters(), lr=0.01)
    for step in range(3):
        b = batch(step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(twin(b["inputs"]), b["labels"]).backward()
        if step < 2:
            opt.step()
    differ = [k for k, v in net.state_dict().items() if not torch.equal(v, twin.state_dict()[k])]
    assert differ == [], differ


def test_the_backward_bisect_names_the_layer_whose_gradient_is_wrong(tmp_path, keys):
    # With the default float64 reference copy, the composite backward took gradients of the
    # optimized module's parameters only, and named the first stage for every fault.
    cap, _, _ = capture(tmp_path, keys, {"arch": "resnet18", "fault": "layer3-grad"})
    rc, d = replay(cap, keys, "--bisect", "--phase", "both")
    assert rc == 1
    assert d["backward_bisect"]["first_bad_layer"] == "layer3", d["backward_bisect"]
    assert d.get("bisect", {}).get("first_bad_layer") in (None, ""), d.get("bisect")


@pytest.mark.parametrize("arch", ["resnet18", "vit"])
def test_torchvision_stages_own_every_parameter_and_compute_the_forward(arch):
    net = vision_models.make({"arch": arch})
    stages = capsule.torchvision_stages(net)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        capsule.Model(arch, net, stages)
    b = batch()
    capsule.check_stages(net, stages, b,
                         lambda m, b: torch.nn.functional.cross_entropy(m(b["inputs"]),
                                                                        b["labels"]))


def test_stages_that_leave_parameters_unowned_are_named():
    net = vision_models.make({"arch": "vit"})
    stages = capsule.torchvision_stages(net)
    stages[0] = ("embed", stages[0][1], ["conv_proj"])  # class token, position embedding: no one's
    with pytest.warns(UserWarning, match="class_token, encoder.pos_embedding"):
        capsule.Model("vit", net, stages)
    with pytest.raises(ValueError, match="'conv_projx', which is neither"):
        capsule.Model("vit", net, [("embed", stages[0][1], ["conv_projx"])] + stages[1:])


def test_an_observe_only_replay_names_the_module_the_capture_recorded(tmp_path, keys):
    config = {"arch": "resnet18", "observe": True}
    net = vision_models.make(config)
    with torch.no_grad():
        net.layer3[0].conv1.weight[0, 0, 0, 0] = float("inf")
    monitor = capsule.Monitor(capsule_dir=str(tmp_path / "caps"), signing_key=str(keys[0]),
                              log_sink=lambda line: None)
    monitor.attach(vision_models.model_of(net, config))
    b = batch()
    with monitor.step(0, batch=b) as s:
        loss = torch.nn.functional.cross_entropy(net(b["inputs"]), b["labels"])
        loss.backward()
        s.end(loss=loss)
    assert s.report["first_anomalous_layer"] == "layer3.0.conv1", s.report["summary"]
    rc, d = replay(s.report["capsule_path"], keys)
    assert d["captured_first_module"] == "layer3.0.conv1", d
    assert "module layer3.0.conv1" in d["diagnosis_text"], d["diagnosis_text"]
