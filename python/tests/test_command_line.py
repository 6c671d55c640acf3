"""`python3 -P -m capsule` as a Python user meets it: where FILE and --model may stand, the commands
it prints, what it says when the model is missing, mistyped or raises, and the refusals a Monitor
owes an answer for. Run by ctest (python_tests), like test_capsule.py."""
import os
import pathlib
import subprocess
import sys

import pytest

import capsule
import py_tiny_gpt as ptg
from test_capsule import CLI, keys, small_setup, train  # noqa: F401 (keys: a fixture)

BUILD_PYTHON = pathlib.Path(capsule.__file__).resolve().parents[1]


def run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "capsule", *map(str, args)], capture_output=True,
                          text=True, env=env)


@pytest.fixture(scope="module")
def nan_capsule(tmp_path_factory, keys):
    caps = train(tmp_path_factory.mktemp("nan"), keys, "--inject", "nan", "--inject-layer",
                 "blocks.1", "--steps", "6", "--inject-step", "4")
    assert len(caps) == 1
    return caps[0]


def test_file_may_follow_options_and_model_may_stand_anywhere(nan_capsule, keys):
    # `--bisect FILE` leaves FILE the capsule; `--pubkey K FILE` takes one key.
    r = run("replay", "--pubkey", keys[1], "--bisect", nan_capsule, "--model", "py_tiny_gpt:factory")
    assert r.returncode == 1, r.stderr
    assert "first divergent layer blocks.1" in r.stdout.splitlines()[0], r.stdout
    assert "bisect (bisect): first bad layer blocks.1" in r.stdout


def test_the_printed_commands_run_as_typed(nan_capsule, keys, tmp_path):
    r = run("replay", nan_capsule, "--model", "py_tiny_gpt:factory", "--pubkey", keys[1],
            "--bisect")
    lines = r.stdout.splitlines()
    again = [l[len("replay: "):] for l in lines if l.startswith("replay: ")]
    assert again and again[0].startswith("python3 -P -m capsule replay "), r.stdout
    assert "--model py_tiny_gpt:factory" in again[0]
    nexts = [l.strip() for l in lines[lines.index(next(l for l in lines if l.startswith("next:"))):]
             if l.startswith("  ")]
    assert nexts[0].startswith("python3 -P -m capsule extract ") and "--model py_tiny_gpt:factory" \
        in nexts[0], nexts
    # The replay line, typed into a shell with this interpreter, gives the same diagnosis.
    argv = again[0].split()
    assert argv[:4] == ["python3", "-P", "-m", "capsule"]
    r2 = subprocess.run([sys.executable, "-P", "-m", "capsule"] + argv[4:], capture_output=True,
                        text=True)
    assert r2.returncode == 1 and r2.stdout.splitlines()[0] == lines[0], r2.stderr
    # The extract it suggests (with a real key) replays alone, and says what it did not judge.
    key = keys[0]
    x = tmp_path / "blocks.1.capsule"
    ext = next(n for n in nexts if " extract " in n).split()
    ext = [str(key) if a == "YOUR.key" else str(x) if a == "blocks.1.capsule" else a
           for a in ext if a != "#"]
    r3 = subprocess.run([sys.executable] + ext[1:] + ["--pubkey", str(keys[1])],
                        capture_output=True, text=True)
    assert r3.returncode == 0, r3.stderr
    r4 = run("replay", x, "--model", "py_tiny_gpt:factory", "--pubkey", keys[1])
    assert r4.returncode == 1, r4.stderr
    assert "loss: none (the extract runs blocks.1 alone)" in r4.stdout, r4.stdout
    assert "FIDELITY_UNSPECIFIED" not in r4.stdout


def test_a_python_capsule_without_its_model_says_how_to_name_it(nan_capsule, keys):
    r = run("replay", nan_capsule, "--pubkey", keys[1])
    assert r.returncode == 2
    assert "--model pkg.module:factory" in r.stderr and "--plugin" not in r.stderr, r.stderr
    # The C++ command line cannot run Python stages: it says which command can.
    c = subprocess.run([CLI, "replay", str(nan_capsule), "--pubkey", str(keys[1])],
                       capture_output=True, text=True)
    assert c.returncode == 2
    assert "python3 -P -m capsule" in c.stderr and "--model" in c.stderr, c.stderr
    # So does its report.
    md = subprocess.run([CLI, "report", str(nan_capsule), "--pubkey", str(keys[1])],
                        capture_output=True, text=True)
    assert "python3 -P -m capsule replay " in md.stdout and "--model <pkg.module:factory>" in \
        md.stdout, md.stdout


@pytest.mark.parametrize("spec,says", [
    ("py_tiny_gpx:factory", "cannot import py_tiny_gpx"),
    ("py_tiny_gpt:factorx", "py_tiny_gpt has no function factorx"),
    ("py_tiny_gpt", "want pkg.module:function"),
])
def test_a_mistyped_model_is_a_usage_error_not_a_traceback(nan_capsule, spec, says):
    r = run("replay", nan_capsule, "--model", spec)
    assert r.returncode == 2, r.stderr
    assert says in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_factory_that_raises_prints_its_traceback_as_one(nan_capsule, keys, tmp_path):
    (tmp_path / "broken_model.py").write_text(
        "def factory(config):\n"
        "    width = config.get('width')\n"
        "    raise ValueError(f'no such width: {width}')\n")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}")
    r = run("replay", nan_capsule, "--model", "broken_model:factory", "--pubkey", keys[1],
            env=env)
    assert r.returncode == 2
    lines = r.stderr.splitlines()
    assert "Traceback (most recent call last):" in lines, r.stderr
    assert any(l.startswith("ValueError: no such width") for l in lines), r.stderr
    assert "\\n" not in r.stderr, r.stderr  # no traceback folded into one escaped line
    assert any(l.startswith("capsule: ") and "ValueError: no such width" in l
               and "(traceback above)" in l for l in lines), r.stderr


def test_a_refused_manual_capture_says_so_each_time(tmp_path, keys):
    net, _, loader = small_setup(tmp_path, keys)
    said = []
    monitor = capsule.Monitor(capsule_dir=str(tmp_path / "manual"), signing_key=str(keys[0]),
                              log_sink=said.append, rerun=False)
    monitor.attach(ptg.engine_model(net))
    reports = []
    for step in range(3):
        x, y, _ = loader.next()
        with monitor.step(step, batch={"input_ids": x, "labels": y}) as s:
            reports.append(s.capture_now("look at this step"))
    assert reports[0]["capsule_path"] and not reports[0]["refused"]
    for r in reports[1:]:
        assert r["refused"] and "no capsule" in r["refused"] and not r["capsule_path"], r
    assert sum("no capsule" in line for line in said) == 2, said


def test_another_interpreter_is_told_which_one_the_package_needs(tmp_path):
    # An interpreter without torch (pyenv's, a venv's): the import names the one that works.
    shadow = tmp_path / "shadow" / "torch"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'torch'\")\n")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path / 'shadow'}:{BUILD_PYTHON}")
    r = subprocess.run([sys.executable, "-c", "import capsule"], capture_output=True, text=True,
                       env=env)
    assert r.returncode != 0
    assert "/usr/bin/python3" in r.stderr and "python3-torch" in r.stderr, r.stderr
