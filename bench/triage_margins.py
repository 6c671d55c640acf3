#!/usr/bin/env python3
"""Clean captures through the triage stages: how far each check stays from its threshold.

Trains the tiny_gpt sample without a fault, captures a step on request, replays it with --json and
collects, per capture, the findings of every stage (replay/internal/triage.h). Half the captures
use the trainer's padding, gradient accumulation over 2 micro-batches, AdamW weight decay 0.1, a
loss scale of 1024 and clipping at 1, so the objective's accumulation and padding checks and the
optimizer's update and clip checks are held too (for the clip: the ratio of the norm it saw to
the FP64 reference's, 1 when it ran after unscaling, 1024 when before).
Prints one line per capture and the margins: the largest value each check reached against its
threshold. A clean capture must have no failed finding in any stage.

    bench/triage_margins.py build/samples/capsule-tiny-gpt
"""
import json
import os
import subprocess
import sys
import tempfile


def run(trainer, work, seed, batch, step, extra):
    name = f"s{seed}-b{batch}-t{step}" + ("-pad-accum2-wd-scale-clip" if extra else "")
    out = os.path.join(work, name)
    subprocess.run([trainer, "train", "--quiet", "--steps", str(step + 1), "--seed", str(seed),
                    "--batch-size", str(batch), "--capture-at-step", str(step),
                    "--capsule-dir", out] + extra, check=True, capture_output=True, cwd=work)
    cap = os.path.join(out, os.listdir(out)[0])
    r = subprocess.run([trainer, "replay", cap, "--allow-unsigned", "--json"],
                       capture_output=True, text=True, cwd=work)
    return name, json.loads(r.stdout)


def main():
    trainer = os.path.abspath(sys.argv[1])
    worst = {}
    failed = 0
    runs = 0
    with tempfile.TemporaryDirectory() as work:
        for seed in (1, 2, 3, 4, 5):
            for batch in (3, 8):
                extra = (["--pad", "--accum", "2", "--weight-decay", "0.1", "--loss-scale", "1024",
                          "--clip", "1"] if batch == 8 else [])
                for step in (10, 60, 150):
                    name, d = run(trainer, work, seed, batch, step, extra)
                    runs += 1
                    line = [name, d["diagnosis"]]
                    for s in d["stages"]:
                        for f in s["findings"]:
                            failed += f["failed"]
                            check = f["check"]
                            if check in ("data.per_sample_loss", "objective.loss_matches",
                                         "objective.labels_equal_inputs",
                                         "objective.trainer_loss", "objective.padding_in_loss",
                                         "optimizer.update_matches",
                                         "optimizer.clip_before_unscale"):
                                line.append(f"{check}={f['value']:.3g}")
                                prev = worst.get(check)
                                if prev is None or f["value"] > prev[0]:
                                    worst[check] = (f["value"], f["threshold"], name)
                    print(" ".join(line), flush=True)
    print(f"{runs} clean captures, {failed} failed findings")
    for check, (value, threshold, name) in sorted(worst.items()):
        print(f"margin {check}: largest {value:.3g} ({name}) against a threshold of {threshold:g}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
