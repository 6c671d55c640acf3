"""The replay's triage stages on a second model, not tiny_gpt: a small Llama-like decoder trained
on right-padded batches (padded_decoder.py). Clean steps replay with no failed finding; each
fault is named by its stage; run by ctest (python_tests)."""
import json
import os
import pathlib
import subprocess
import sys

import capsule
from test_capsule import keys  # noqa: F401 (a fixture)

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import padded_decoder as pd  # noqa: E402


def monitor(tmp_path, keys, **kw):
    return capsule.Monitor(capsule_dir=str(tmp_path / "caps"), signing_key=str(keys[0]),
                           log_sink=lambda line: None, **kw)


def replay(cap, keys, *args):
    env = dict(os.environ, PYTHONPATH=f"{HERE}:{os.environ.get('PYTHONPATH', '')}")
    r = subprocess.run([sys.executable, "-P", "-m", "capsule", "replay", str(cap), "--model",
                        "padded_decoder:factory", "--pubkey", str(keys[1]), "--json", *args],
                       capture_output=True, text=True, env=env)
    assert r.stdout, r.stderr
    return r.returncode, json.loads(r.stdout)


def failed(d):
    return [f"{s['stage']}:{f['check']}: {f['detail']}" for s in d["stages"]
            for f in s.get("findings", []) if f.get("failed")]


def finding(d, check):
    return next((f for s in d["stages"] for f in s.get("findings", []) if f["check"] == check),
                None)


def test_clean_right_padded_steps_have_no_failed_finding(tmp_path, keys):
    # The pad id as the label at padded positions (masked out of the loss) made 44-57% of the
    # labels "equal their input" and failed objective.labels_equal_inputs.
    for ignore_pad in (False, True):
        m = monitor(tmp_path / str(ignore_pad), keys)
        _, report = pd.train(pd.config_of(seed=1), m, steps=4, capture_at=3, ignore_pad=ignore_pad)
        rc, d = replay(report["capsule_path"], keys)
        assert failed(d) == [] and rc == 0, (d.get("diagnosis_text"), failed(d))
        assert d["diagnosis"] == "NO_DIVERGENCE"
        f = finding(d, "objective.labels_equal_inputs")
        assert f is not None and f["value"] < 0.2, f


def test_a_masked_softmax_nan_with_an_all_padding_sample_is_numerics_not_data(tmp_path, keys):
    c = pd.config_of(seed=2, fault="masked-softmax", layer=1)
    _, report = pd.train(c, monitor(tmp_path, keys), steps=4, empty_at=3)
    assert report["triggered"] and report["capsule_path"], report
    rc, d = replay(report["capsule_path"], keys)
    assert rc == 1
    assert d["diagnosis"] == "NUMERICS", (d["diagnosis"], failed(d))
    assert d["first_divergent_layer"] == "blocks.1"
    empty = finding(d, "data.empty_sample")
    assert empty is not None and not empty.get("failed") and empty["sample_index"] == 1, empty


def test_a_block_detached_on_the_optimized_path_only_is_found(tmp_path, keys):
    c = pd.config_of(seed=3, fault="detach", layer=1)
    _, report = pd.train(c, monitor(tmp_path, keys), steps=3, capture_at=2)
    rc, d = replay(report["capsule_path"], keys, "--phase", "both", "--bisect")
    assert rc == 1, d.get("diagnosis_text")
    assert d["diagnosis"] == "NUMERICS"
    assert d["first_divergent_layer"] == "blocks.1" and d["first_divergent_phase"] == "BACKWARD"
    entry = next(l for l in d["layers"] if l["name"] == "blocks.1" and l["phase"] == "BACKWARD")
    assert entry["verdict"] == "DIVERGED" and "no gradient on the optimized path" in entry["reason"]


def test_prompt_tokens_in_the_loss_are_an_objective_finding(tmp_path, keys):
    m = monitor(tmp_path / "in", keys)
    _, report = pd.train(pd.config_of(seed=4), m, steps=2, capture_at=1, prompt=3,
                         prompt_in_loss=True)
    rc, d = replay(report["capsule_path"], keys)
    assert rc == 1 and d["diagnosis"] == "OBJECTIVE", failed(d)
    assert finding(d, "objective.prompt_in_loss")["failed"]
    m = monitor(tmp_path / "out", keys)
    _, report = pd.train(pd.config_of(seed=4), m, steps=2, capture_at=1, prompt=3)
    rc, d = replay(report["capsule_path"], keys)
    assert rc == 0 and failed(d) == [], failed(d)
    assert not finding(d, "objective.prompt_in_loss").get("failed")


def test_a_parameter_declared_frozen_but_trained_is_a_gradients_finding(tmp_path, keys):
    m = monitor(tmp_path / "trained", keys, declared_frozen=["embed.*", "blocks.?.attn_norm.*"])
    _, report = pd.train(pd.config_of(seed=5), m, steps=2, capture_at=1)
    rc, d = replay(report["capsule_path"], keys)
    assert rc == 1 and d["diagnosis"] == "GRADIENTS", failed(d)
    named = sorted(f["parameter"] for s in d["stages"] for f in s.get("findings", [])
                   if f["check"] == "gradients.declared_frozen_trained")
    assert named == ["blocks.0.attn_norm.weight", "blocks.1.attn_norm.weight",
                     "blocks.2.attn_norm.weight", "embed.weight"], named
    # Frozen as declared: nothing fails.
    m = monitor(tmp_path / "frozen", keys, declared_frozen=["embed.*", "blocks.?.attn_norm.*"])
    _, report = pd.train(pd.config_of(seed=5), m, steps=2, capture_at=1,
                         freeze=("embed.", "blocks.0.attn_norm", "blocks.1.attn_norm",
                                 "blocks.2.attn_norm"))
    rc, d = replay(report["capsule_path"], keys)
    assert rc == 0 and failed(d) == [], failed(d)
    assert finding(d, "gradients.declared_frozen")["value"] == 4
