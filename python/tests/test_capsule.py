"""The Python package end to end: py_tiny_gpt trains under capsule.Monitor, the C++ `capsule` CLI
verifies what it wrote, and `python3 -m capsule replay` (the C++ replayer driving the Python
stages) names the same diagnosis and first bad layer as for the C++ sample.

Run by ctest (python_tests) with PYTHONPATH holding build/python and samples/py_tiny_gpt, and
CAPSULE_CLI naming the built `capsule` executable.
"""
import copy
import json
import math
import os
import pathlib
import random
import re
import subprocess
import sys

import pytest
import torch

import capsule
import py_tiny_gpt as ptg

CLI = os.environ.get("CAPSULE_CLI", "capsule")
ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    subprocess.run([CLI, "keygen", "--out", str(d / "k")], check=True, capture_output=True)
    return d / "k.key", d / "k.pub"


def train(tmp_path, keys, *args):
    out = tmp_path / "caps"
    argv = ["--quiet", "--capsule-dir", str(out), "--key", str(keys[0])] + list(args)
    assert ptg.train(ptg.parse(argv)) == 0
    return sorted(out.glob("*.capsule")) if out.exists() else []


def replay(cap, keys, *args):
    r = subprocess.run([sys.executable, "-P", "-m", "capsule", "replay", str(cap), "--model",
                        "py_tiny_gpt:factory", "--pubkey", str(keys[1]), "--json"] + list(args),
                       capture_output=True, text=True)
    assert r.stdout, r.stderr
    return r.returncode, json.loads(r.stdout)


@pytest.mark.parametrize("kind,layer,extra", [
    ("nan", "blocks.2", ["--steps", "6", "--inject-step", "4"]),
    ("softmax-overflow", "blocks.1", ["--steps", "6", "--inject-step", "4"]),
    ("tail-block", "blocks.1", ["--steps", "6", "--inject-step", "2", "--capture-at-step", "4"]),
    ("eps", "blocks.3", ["--steps", "6", "--inject-step", "2", "--capture-at-step", "4"]),
])
def test_layer_faults_replay_to_numerics_at_their_layer(tmp_path, keys, kind, layer, extra):
    caps = train(tmp_path, keys, "--inject", kind, "--inject-layer", layer, *extra)
    assert len(caps) == 1
    v = subprocess.run([CLI, "verify", str(caps[0]), "--pubkey", str(keys[1])],
                       capture_output=True, text=True)
    assert v.returncode == 0 and ": OK, signed by key" in v.stdout, v.stdout + v.stderr
    rc, d = replay(caps[0], keys, "--bisect")
    assert rc == 1
    assert d["diagnosis"] == "NUMERICS", d.get("diagnosis_text")
    assert d["first_divergent_layer"] == layer
    assert d["bisect"]["first_bad_layer"] == layer
    n = len(d["bisect"]["probe_log"])
    assert n <= math.ceil(math.log2(8)) + 1


def test_bad_data_names_the_sample(tmp_path, keys):
    caps = train(tmp_path, keys, "--steps", "62", "--batch-size", "2", "--seed", "1",
                 "--inject", "bad-data", "--inject-step", "60")
    assert caps, "the loss spike did not fire"
    rc, d = replay(caps[0], keys)
    assert rc == 1
    assert d["diagnosis"] == "DATA"
    failed = [f for s in d["stages"] for f in s["findings"] if f.get("failed")]
    assert failed[0]["check"] == "data.bad_sample" and failed[0].get("sample_index", 0) == 0


def test_transient_does_not_reproduce(tmp_path, keys):
    caps = train(tmp_path, keys, "--steps", "5", "--inject", "transient", "--inject-layer",
                 "blocks.1", "--inject-step", "3")
    assert len(caps) == 1
    rc, d = replay(caps[0], keys)
    assert rc == 1
    assert d["fidelity"] == "NOT_REPRODUCED" and d["diagnosis"] == "TRANSIENT"


def test_clean_run_writes_nothing_and_a_manual_capture_agrees(tmp_path, keys):
    assert train(tmp_path, keys, "--steps", "6") == []
    caps = train(tmp_path, keys, "--steps", "6", "--capture-at-step", "4")
    assert len(caps) == 1
    rc, d = replay(caps[0], keys, "--bisect")
    assert rc == 0, d.get("diagnosis_text")
    assert d["diagnosis"] == "NO_DIVERGENCE"
    assert d["fidelity"] == "REPRODUCED_EXACT"


def small_setup(tmp_path, keys):
    net = ptg.PyTinyGpt({"n_layers": 2, "seed": 3})
    monitor = capsule.Monitor(capsule_dir=str(tmp_path / "caps"), signing_key=str(keys[0]),
                              log_sink=lambda line: None)
    monitor.attach(ptg.engine_model(net))
    loader = ptg.Loader(4, 32, 3)
    return net, monitor, loader


def run_step(net, x, y):
    h = x
    for _, fn in ptg.stages(net)[:-1]:
        h = fn(net, h, {"labels": y})
    return ptg.stages(net)[-1][1](net, h, {"labels": y})


def test_a_generation_step_capsule_carries_its_generation_section(tmp_path, keys):
    net, monitor, loader = small_setup(tmp_path, keys)
    with pytest.raises(ValueError, match="top_p in"):
        monitor.set_generation(prompt_length=5, top_p=2.0)
    with pytest.raises(TypeError, match="unknown field 'temprature'"):
        monitor.set_generation(temprature=0.5)
    monitor.set_generation(prompt_length=5, prefill_chunk=2, temperature=0.7, top_k=40,
                           stop_tokens=[10, 13], cache_layout="batch,heads,position,head_dim",
                           post_rotation_keys=True, adapter_merged=True, adapter_rank=4,
                           adapter_alpha=8.0, adapter_sha256="ab" * 32)
    x, y, cursor = loader.next()
    with monitor.step(0, batch={"input_ids": x, "labels": y}, cursor=cursor) as s:
        s.capture_now("generation")
    out = subprocess.run([CLI, "inspect", s.report["capsule_path"], "--pubkey", str(keys[1]),
                          "--json"], capture_output=True, text=True)
    g = json.loads(out.stdout)["generation"]
    assert g["prompt_length"] == "5" and g["prefill_chunk"] == "2"
    assert g["sampling"]["top_k"] == 40 and g["sampling"]["stop_tokens"] == ["10", "13"]
    assert g["cache"]["post_rotation_keys"] and g["adapter_merged"]
    assert g["adapter_rank"] == "4" and g["adapter_alpha"] == 8 and g["adapter_sha256"] == "ab" * 32
    # Without fields, the steps are training steps again (a step past the rate limit's window).
    monitor.set_generation()
    with monitor.step(1000, batch={"input_ids": x, "labels": y}, cursor=cursor) as s:
        s.capture_now("training")
    assert s.report["capsule_path"], s.report["summary"]
    out = subprocess.run([CLI, "inspect", s.report["capsule_path"], "--pubkey", str(keys[1]),
                          "--json"], capture_output=True, text=True)
    assert "generation" not in json.loads(out.stdout)


def test_an_exception_in_the_step_becomes_a_capsule_and_training_goes_on(tmp_path, keys):
    net, monitor, loader = small_setup(tmp_path, keys)
    x, y, cursor = loader.next()
    with monitor.step(0, batch={"input_ids": x, "labels": y}, cursor=cursor) as s:
        raise ValueError("shapes do not match")
    assert isinstance(s.exception, ValueError)
    assert s.report["trigger"] == "EXCEPTION"
    assert s.report["capsule_path"], s.report["summary"]
    info = subprocess.run([CLI, "inspect", s.report["capsule_path"], "--pubkey", str(keys[1])],
                          capture_output=True, text=True)
    assert "EXCEPTION" in info.stdout and "shapes do not match" in info.stdout
    # The next step runs as usual.
    x, y, cursor = loader.next()
    with monitor.step(1, batch={"input_ids": x, "labels": y}, cursor=cursor) as s:
        loss = run_step(net, x, y)
        loss.backward()
        s.end(loss=loss, grad_norm=ptg.grad_norm(net))
    assert s.exception is None and not s.report["triggered"]


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_during_the_capture_rerun_reaches_the_trainer(tmp_path, keys, interrupt):
    # Ctrl-C while the Monitor re-runs the step through the stages: the KeyboardInterrupt (or any
    # BaseException that is not an Exception) is the trainer's, not a failed capture to log.
    net = ptg.PyTinyGpt({"n_layers": 2, "seed": 3})
    stages = list(ptg.stages(net))
    armed = [False]
    name, fn = stages[1]

    def interrupted(module, x, batch):
        if armed[0]:
            raise interrupt()
        return fn(module, x, batch)

    stages[1] = (name, interrupted)
    logged = []
    monitor = capsule.Monitor(capsule_dir=str(tmp_path / "caps"), signing_key=str(keys[0]),
                              log_sink=logged.append)
    monitor.attach(capsule.Model("py_tiny_gpt", net, stages, config=net.spec))
    loader = ptg.Loader(4, 32, 3)
    x, y, cursor = loader.next()
    params = {n: p.detach().clone() for n, p in net.named_parameters()}
    armed[0] = True
    with pytest.raises(interrupt):
        with monitor.step(0, batch={"input_ids": x, "labels": y}, cursor=cursor) as s:
            s.end(loss=float("nan"))
    assert s.exception is None  # not turned into an EXCEPTION capture either
    assert all(torch.equal(p, params[n]) for n, p in net.named_parameters())
    # Raised once: the Monitor goes on as before once the trainer has handled it.
    armed[0] = False
    x, y, cursor = loader.next()
    with monitor.step(1, batch={"input_ids": x, "labels": y}, cursor=cursor) as s:
        loss = run_step(net, x, y)
        s.end(loss=loss)
    assert s.exception is None and not s.report["triggered"]


def test_python_m_capsule_runs_no_module_from_the_current_directory(tmp_path):
    # A json.py or copy.py (the package imports both) in the folder a capsule was downloaded to must
    # not run. With -P, as the docs spell the command, neither may modules Python's own -m
    # machinery imports (importlib) nor a capsule/ package there.
    marker = tmp_path / "ran"

    def poison(path, name):
        path.write_text(f"open({str(marker)!r}, 'a').write('{name} ')\nraise SystemExit(97)\n")

    for name in ("json", "copy"):
        poison(tmp_path / f"{name}.py", name)
    for flags in ([], ["-P"]):
        if flags:
            poison(tmp_path / "importlib.py", "importlib")
            (tmp_path / "capsule").mkdir()
            poison(tmp_path / "capsule" / "__init__.py", "capsule")
        r = subprocess.run([sys.executable] + flags + ["-m", "capsule", "verify", "missing.capsule"],
                           cwd=tmp_path, capture_output=True, text=True)
        assert not marker.exists(), f"{flags}: ran {marker.read_text()}from the current directory"
        assert r.returncode == 2, r.stdout + r.stderr
        assert "missing.capsule" in r.stderr, r.stderr


def test_a_capture_leaves_parameters_gradients_and_rngs_untouched(tmp_path, keys):
    net, monitor, loader = small_setup(tmp_path, keys)
    monitor.register_python_rngs()
    x, y, cursor = loader.next()
    torch.manual_seed(11)
    random.seed(5)
    with monitor.step(0, batch={"input_ids": x, "labels": y}, cursor=cursor) as s:
        loss = run_step(net, x, y)
        loss.backward()
        params = {n: p.detach().clone() for n, p in net.named_parameters()}
        grads = {n: p.grad.clone() for n, p in net.named_parameters()}
        torch_rng = torch.get_rng_state()
        py_rng = random.getstate()
        s.end(loss=loss, grad_norm=ptg.grad_norm(net))
        s.capture_now("test")
    assert s.report["capsule_path"], s.report["summary"]
    for n, p in net.named_parameters():
        assert torch.equal(p.detach(), params[n]), n
        assert torch.equal(p.grad, grads[n]), n
    assert torch.equal(torch.get_rng_state(), torch_rng)
    assert random.getstate() == py_rng


def test_a_background_write_lands_after_training_goes_on(tmp_path, keys):
    net = ptg.PyTinyGpt({"n_layers": 2, "seed": 3})
    lines = []
    monitor = capsule.Monitor(capsule_dir=str(tmp_path / "caps"), signing_key=str(keys[0]),
                              background_write=True, log_sink=lines.append)
    monitor.attach(ptg.engine_model(net))
    x, y, cursor = ptg.Loader(4, 32, 3).next()
    with monitor.step(0, batch={"input_ids": x, "labels": y}, cursor=cursor) as s:
        s.capture_now("background")
    assert s.report["queued"], s.report["summary"]
    path = s.report["capsule_path"]
    monitor.wait_for_writes()
    assert monitor.capsules_written == 1
    assert any("wrote " + path in line for line in lines), lines
    r = subprocess.run([CLI, "verify", path, "--pubkey", str(keys[1])], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_python_and_a_cpp_capsule_of_the_same_kind_compare_with_diff(tmp_path, keys):
    caps = train(tmp_path, keys, "--steps", "3", "--capture-at-step", "2")
    cpp_dir = tmp_path / "cpp"
    trainer = os.environ.get("CAPSULE_TINY_GPT")
    if not trainer:
        pytest.skip("CAPSULE_TINY_GPT (the C++ sample trainer) is not set")
    subprocess.run([trainer, "train", "--quiet", "--steps", "3", "--capture-at-step", "2",
                    "--capsule-dir", str(cpp_dir), "--key", str(keys[0])], check=True,
                   capture_output=True)
    cpp = sorted(cpp_dir.glob("*.capsule"))
    r = subprocess.run([CLI, "diff", str(caps[0]), str(cpp[0]), "--pubkey", str(keys[1])],
                       capture_output=True, text=True)
    # Two models of the same shape: the identity files (same corpus, tokenizer, template) agree,
    # the registry names and weights differ, and the layers line up by name, forward and backward.
    assert r.returncode == 1, r.stderr
    rows = r.stdout.splitlines()
    assert any(l.split()[:2] == ["config", "model.registry_name"] and "py_tiny_gpt" in l
               for l in rows), r.stdout
    assert not any("corpus:corpus.txt" in l or "tokenizer:tokenizer.json" in l for l in rows)
    assert any(l.split()[:3] == ["layers", "blocks.3/forward", "rms"] for l in rows), r.stdout
    assert any(l.split()[:3] == ["layers", "embed/backward", "rms"] for l in rows), r.stdout
    # The Python capsule says it was written from Python; the C++ one does not.
    assert any(l.split()[:3] == ["environment", "libraries.python", sys.version.split()[0]]
               for l in rows), r.stdout
    assert not any(" - " in l and l.startswith("layers") for l in rows), "a layer on one side only"


def run_readme_python_snippet(tmp_path, keys, forward=None):
    """Runs the README's Python loop over three batches of a small model; returns its globals
    (`monitor` among them) and the model. `forward(net, batch, batches)` replaces the plain
    forward pass."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Python"):]
    snippet = re.search(r"```python\n(.*?)\n```", section, re.S).group(1)
    net, _, loader = small_setup(tmp_path, keys)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    batches = []
    for _ in range(3):
        x, y, _ = loader.next()
        batches.append({"input_ids": x, "labels": y})
    plain = lambda b: run_step(net, b["input_ids"], b["labels"])
    env = {"capsule": capsule, "net": net, "stages": ptg.stages(net), "batches": batches,
           "optimizer": optimizer, "capsule_dir": str(tmp_path / "readme"),
           "key": str(keys[0]), "grad_norm": ptg.grad_norm,
           "forward": (lambda b: forward(net, b, batches)) if forward else plain}
    exec(compile(snippet, "README.md (Python)", "exec"), env)
    return env, net


def test_readme_python_snippet_runs(tmp_path, keys):
    env, _ = run_readme_python_snippet(tmp_path, keys)
    assert env["monitor"].capsules_written == 0


def test_readme_python_snippet_never_steps_on_a_nan_gradient(tmp_path, keys):
    # The loss is finite at every step; one step's gradient is NaN (a hook poisons it). The
    # snippet's guard must keep that step's update out of the weights.
    def forward(net, b, batches):
        loss = run_step(net, b["input_ids"], b["labels"])
        if b is batches[1]:
            handle = []
            handle.append(next(net.parameters()).register_hook(
                lambda g: (handle[0].remove(), torch.full_like(g, float("nan")))[1]))
        return loss

    env, net = run_readme_python_snippet(tmp_path, keys, forward)
    assert env["monitor"].capsules_written == 1  # the NaN gradient's capsule
    assert all(torch.isfinite(p).all() for p in net.parameters()), "stepped on a NaN gradient"


def test_sequential_stages_run_the_module_and_a_nan_names_its_child(tmp_path, keys):
    torch.manual_seed(0)
    seq = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    loss_fn = lambda out, batch: torch.nn.functional.mse_loss(out, batch["labels"])
    stages = capsule.sequential_stages(seq, loss_fn)
    assert [name for name, _ in stages] == ["0", "1", "2", "loss"]
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    h = x
    for _, fn in stages[:-1]:
        h = fn(seq, h, {"labels": y})
    assert torch.equal(h, seq(x))
    with pytest.raises(TypeError, match="nn.Sequential"):
        capsule.sequential_stages(torch.nn.Linear(2, 2), loss_fn)
    # A NaN in the second linear layer's weights: the capsule names layer "2" as first anomalous.
    with torch.no_grad():
        seq[2].weight[0, 0] = float("nan")
    monitor = capsule.Monitor(capsule_dir=str(tmp_path / "caps"), signing_key=str(keys[0]),
                              log_sink=lambda line: None)
    monitor.attach(capsule.Model("mlp", seq, stages))
    with monitor.step(0, batch={"inputs": x, "labels": y}) as s:
        loss = loss_fn(seq(x), {"labels": y})
        loss.backward()
        s.end(loss=loss)
    assert s.report["trigger"] == "NON_FINITE_LOSS"
    assert s.report["first_anomalous_layer"] == "2", s.report["summary"]


def test_check_stages_refuses_glue_the_stages_miss():
    class Residual(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(4, 4)
            self.b = torch.nn.Linear(4, 1)

        def forward(self, x):
            return self.b(x + torch.relu(self.a(x)))  # a residual add and an activation

    torch.manual_seed(0)
    net = Residual()
    batch = {"inputs": torch.randn(3, 4), "labels": torch.randn(3, 1)}
    forward = lambda m, b: torch.nn.functional.mse_loss(m(b["inputs"]), b["labels"])
    loss = lambda m, x, b: torch.nn.functional.mse_loss(x, b["labels"])
    missing_glue = [("a", lambda m, x, b: m.a(x)), ("b", lambda m, x, b: m.b(x)), ("loss", loss)]
    with pytest.raises(ValueError, match="glue the stages miss"):
        capsule.check_stages(net, missing_glue, batch, forward)
    with_glue = [("a", lambda m, x, b: x + torch.relu(m.a(x))), ("b", lambda m, x, b: m.b(x)),
                 ("loss", loss)]
    assert capsule.check_stages(net, with_glue, batch, forward) == pytest.approx(
        float(forward(net, batch)))


def test_observe_only_names_the_first_non_finite_module(tmp_path, keys):
    torch.manual_seed(0)
    net = ptg.PyTinyGpt({"n_layers": 2, "seed": 1})
    with torch.no_grad():
        net.blocks[1].fc1.weight[0, 0] = float("inf")  # fc1's output, then the block, go bad

    def forward(m, batch):
        h = m.embed(batch["input_ids"])
        for block in m.blocks:
            h = block(h)
        logits = m.lm_head(m.ln_f(h))
        return torch.nn.functional.cross_entropy(logits.reshape(-1, 256),
                                                 batch["labels"].reshape(-1))

    monitor = capsule.Monitor(capsule_dir=str(tmp_path / "caps"), signing_key=str(keys[0]),
                              log_sink=lambda line: None)
    monitor.attach(capsule.Model.observe("observed_gpt", net, forward))
    x, y, cursor = ptg.Loader(4, 32, 1).next()
    batch = {"input_ids": x, "labels": y}
    with monitor.step(0, batch=batch, cursor=cursor) as s:
        loss = forward(net, batch)
        loss.backward()
        s.end(loss=loss)
    assert s.report["trigger"] == "NON_FINITE_LOSS", s.report["summary"]
    assert s.report["first_anomalous_layer"] == "blocks.1.fc1", s.report["summary"]
    out = subprocess.run([CLI, "inspect", s.report["capsule_path"], "--pubkey", str(keys[1]),
                          "--json"], capture_output=True, text=True)
    c = json.loads(out.stdout)
    names = [l["name"] for l in c["numerics"]["layers"]]
    assert "blocks.0.fc1" in names and "lm_head" in names
    assert any(l["name"] == "blocks.0.fc2" and l["phase"] == "BACKWARD"
               for l in c["numerics"]["layers"])
    assert "observe-only" in c["annotations"]["capsule.layers"]
    # Training steps themselves run no hooks: nothing was recorded outside the capture.
    assert all(len(sub._forward_hooks) == 0 for sub in net.modules())


def test_decoder_stages_match_a_plain_decoder_and_refuse_glue():
    class Decoder(torch.nn.Module):
        def __init__(self, scale=1.0):
            super().__init__()
            self.embed = torch.nn.Embedding(16, 8)
            self.blocks = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))
            self.ln_f = torch.nn.LayerNorm(8)
            self.lm_head = torch.nn.Linear(8, 16)
            self.scale = scale

        def forward(self, ids):
            h = self.embed(ids) * self.scale  # glue when scale != 1
            for blk in self.blocks:
                h = blk(h)
            return self.lm_head(self.ln_f(h))

    ce = lambda logits, b: torch.nn.functional.cross_entropy(logits.reshape(-1, 16),
                                                             b["labels"].reshape(-1))
    torch.manual_seed(0)
    batch = {"input_ids": torch.randint(0, 16, (2, 5)), "labels": torch.randint(0, 16, (2, 5))}
    forward = lambda m, b: ce(m(b["input_ids"]), b)
    plain = Decoder()
    stages = capsule.decoder_stages(plain, ce)
    assert [n for n, _ in stages] == ["embed", "blocks.0", "blocks.1", "blocks.2", "ln_f",
                                      "lm_head", "loss"]
    capsule.check_stages(plain, stages, batch, forward)
    scaled = Decoder(scale=8.0)
    with pytest.raises(ValueError, match="glue the stages miss"):
        capsule.check_stages(scaled, capsule.decoder_stages(scaled, ce), batch, forward)
    with pytest.raises(ValueError, match="no submodule 'norm'"):
        capsule.decoder_stages(plain, ce, norm="norm")


def test_monitor_takes_the_cpp_options_and_refuses_unknown_ones(tmp_path, keys):
    with pytest.raises(TypeError, match="unknown option 'capsule_directory'"):
        capsule.Monitor(capsule_directory="x")
    with pytest.raises(TypeError, match="unknown spike rule field 'windw'"):
        capsule.Monitor(loss_spike={"windw": 3})
    with pytest.raises(ValueError, match="weight_policy"):
        capsule.Monitor(weight_policy="some")
    net = ptg.PyTinyGpt({"n_layers": 2, "seed": 3})
    monitor = capsule.Monitor(capsule_dir=str(tmp_path / "caps"), signing_key=str(keys[0]),
                              weight_policy="none", trigger_non_finite_loss=False,
                              loss_spike={"window": 10, "warmup": 10}, run_name="opts",
                              log_sink=lambda line: None)
    monitor.attach(ptg.engine_model(net))
    x, y, cursor = ptg.Loader(4, 32, 3).next()
    with monitor.step(0, batch={"input_ids": x, "labels": y}) as s:
        s.end(loss=float("nan"))  # the non-finite loss trigger is off
    assert not s.report["triggered"]
    with monitor.step(1, batch={"input_ids": x, "labels": y}) as s:
        s.capture_now("options")
    out = subprocess.run([CLI, "inspect", s.report["capsule_path"], "--pubkey", str(keys[1]),
                          "--json"], capture_output=True, text=True)
    c = json.loads(out.stdout)
    assert c["model"]["weight_policy"] == "WEIGHTS_NONE"
    assert not any(t.get("role") == "PARAMETER" for t in c.get("tensors", []))
    assert c["run_name"] == "opts"


def test_spike_threshold_is_the_monitors_rule_with_its_options():
    # A loss settled near 0.005: an ordinary batch at 0.09 is under the 2-nat floor, but the
    # median rule (no line fit, no floor) puts the threshold under it.
    settled = [0.005 * math.exp(0.25 * math.sin(i * 1.3)) for i in range(60)]
    assert capsule.spike_threshold(settled[:49]) is None  # warm-up: 50 values
    assert 2.0 < capsule.spike_threshold(settled) < 2.1
    assert capsule.spike_threshold(settled, detrend=False, min_rise=0.0) < 0.09
    assert capsule.spike_threshold(settled, min_rise=0.5) < 0.51
    # the gradient norm's own defaults: 1000x its median, no floor
    assert capsule.spike_threshold([2.0] * 50, "grad_norm") == pytest.approx(2000.0)
    with pytest.raises(ValueError, match="kind is 'loss' or 'grad_norm'"):
        capsule.spike_threshold(settled, "lr")
    with pytest.raises(TypeError, match="unknown spike rule field 'min_rice'"):
        capsule.spike_threshold(settled, min_rice=1.0)
    capsule.Monitor(loss_spike={"detrend": False, "min_rise": 0.5, "max_rise": 3.0},
                    grad_norm_spike={"detrend": True, "min_rise": 0.0})


def test_the_capture_rerun_draws_python_and_numpy_rngs_as_the_step_did(tmp_path, keys):
    import numpy
    torch.manual_seed(0)
    seq = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))

    def noisy(m, x, b):  # a stage drawing from Python's and NumPy's RNGs (augmentation, say)
        return m[0](x) * (1 + random.random()) + float(numpy.random.rand())

    stages = [("0", noisy), ("1", lambda m, x, b: m[1](x)),
              ("loss", lambda m, x, b: torch.nn.functional.mse_loss(x, b["labels"]))]
    monitor = capsule.Monitor(capsule_dir=str(tmp_path / "caps"), signing_key=str(keys[0]),
                              log_sink=lambda line: None)
    monitor.register_python_rngs()
    monitor.attach(capsule.Model("noisy", seq, stages))
    batch = {"inputs": torch.randn(3, 4), "labels": torch.randn(3, 1)}
    random.seed(1)
    numpy.random.seed(2)
    with monitor.step(0, batch=batch) as s:
        h = batch["inputs"]
        for _, fn in stages:
            h = fn(seq, h, batch)
        after_step = (random.getstate(), numpy.random.get_state()[1].copy())
        s.end(loss=h)
        s.capture_now("rng")
    # The re-run drew the same numbers: it reproduced the loss bitwise.
    assert s.report["rerun_reproduced"], s.report["summary"]
    # And the trainer's RNGs are where its step left them.
    assert random.getstate() == after_step[0]
    assert (numpy.random.get_state()[1] == after_step[1]).all()


def test_a_capsule_names_the_checkpoint_torch_save_wrote(tmp_path, keys):
    # The trainer's weights come from a checkpoint torch.save wrote (the state dict itself, an
    # OrderedDict); a capsule that embeds only the anomalous layer names it, with every tensor's
    # hash.
    torch.manual_seed(0)
    seq = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    ckpt = tmp_path / "model.pt"
    torch.save(seq.state_dict(), ckpt)
    loss_fn = lambda out, batch: torch.nn.functional.mse_loss(out, batch["labels"])
    monitor = capsule.Monitor(capsule_dir=str(tmp_path / "caps"), signing_key=str(keys[0]),
                              weight_policy="anomalous_layer", log_sink=lambda line: None)
    monitor.set_weights_checkpoint(str(ckpt))
    monitor.attach(capsule.Model("mlp", seq, capsule.sequential_stages(seq, loss_fn)))
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    x[0, 0] = float("nan")
    with monitor.step(0, batch={"inputs": x, "labels": y}) as s:
        loss = loss_fn(seq(x), {"labels": y})
        loss.backward()
        s.end(loss=loss)
    assert s.report["trigger"] == "NON_FINITE_LOSS"
    out = subprocess.run([CLI, "inspect", s.report["capsule_path"], "--pubkey", str(keys[1]),
                          "--json"], capture_output=True, text=True, check=True).stdout
    ref = json.loads(out)["model"]["weights_reference"]
    assert ref["path"] == str(ckpt)
    assert ref["format"] == "torch_pickle"
    assert ref["matches_step"] is True
    assert sorted(t["name"] for t in ref["tensors"]) == sorted(seq.state_dict())
    text = subprocess.run([CLI, "inspect", s.report["capsule_path"], "--pubkey", str(keys[1])],
                          capture_output=True, text=True, check=True).stdout
    assert "holds this step's weights" in text
