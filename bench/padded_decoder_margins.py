#!/usr/bin/env python3
"""Clean captures of a second model through the triage stages: the small Llama-like decoder on
right-padded batches (python/tests/padded_decoder.py: the pad id in the inputs, labels the pad id
or -100 at padded positions, the loss mask 0 there), trained with AdamW under capsule.Monitor,
captured on request and replayed with `python3 -P -m capsule replay --json`. Prints one line per
capture (its diagnosis and the values of the checks that padding stresses) and the count of
failed findings, which must be 0. Run with PYTHONPATH holding build/python:

    PYTHONPATH=build/python /usr/bin/python3 bench/padded_decoder_margins.py [SEEDS] [STEPS...]

(default: seeds 1-5, capture steps 2, 5, 9, with the pad id and with -100 as padded labels: 30
captures).
"""
import json
import os
import pathlib
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parents[1] / "python" / "tests"
sys.path.insert(0, str(HERE))
import capsule  # noqa: E402
import padded_decoder as pd  # noqa: E402

CHECKS = ("objective.labels_equal_inputs", "objective.loss_matches", "data.per_sample_loss",
          "objective.padding_in_loss")


def main(argv):
    seeds = range(1, 1 + (int(argv[0]) if argv else 5))
    steps = [int(s) for s in argv[1:]] or [2, 5, 9]
    runs = failed = 0
    worst = {}
    env = dict(os.environ, PYTHONPATH=f"{HERE}:{os.environ.get('PYTHONPATH', '')}")
    with tempfile.TemporaryDirectory() as work:
        for seed in seeds:
            for ignore_pad in (False, True):
                for step in steps:
                    name = f"s{seed}-t{step}-{'ignore' if ignore_pad else 'pad'}"
                    m = capsule.Monitor(capsule_dir=f"{work}/{name}", log_sink=lambda line: None)
                    _, report = pd.train(pd.config_of(seed=seed), m, steps=step + 1,
                                         capture_at=step, ignore_pad=ignore_pad, data_seed=seed)
                    r = subprocess.run([sys.executable, "-P", "-m", "capsule", "replay",
                                        report["capsule_path"], "--model",
                                        "padded_decoder:factory", "--allow-unsigned", "--json"],
                                       capture_output=True, text=True, env=env)
                    d = json.loads(r.stdout)
                    runs += 1
                    line = [name, d["diagnosis"], f"exit {r.returncode}"]
                    for s in d["stages"]:
                        for f in s.get("findings", []):
                            if f.get("failed"):
                                failed += 1
                                line.append(f"FAILED {f['check']}: {f['detail']}")
                            if f["check"] in CHECKS:
                                v = f.get("value", 0)
                                line.append(f"{f['check']}={v:.3g}")
                                if f["check"] not in worst or v > worst[f["check"]][0]:
                                    worst[f["check"]] = (v, f.get("threshold", 0), name)
                    print(" ".join(line), flush=True)
    print(f"{runs} clean captures, {failed} failed findings")
    for check, (value, threshold, name) in sorted(worst.items()):
        print(f"margin {check}: largest {value:.3g} ({name}) against a threshold of {threshold:g}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
