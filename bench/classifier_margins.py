#!/usr/bin/env python3
"""Clean classifier captures through the data, objective and optimizer stages: how far each check
stays from its threshold (README, "Triage").

Trains torchvision's resnet18 and a small ViT (python/tests/vision_models.py) on random 32x32
images of 10 classes under capsule.Monitor with a torch.optim AdamW or Adam attached, captures the
last step on request, replays it with --json and prints, per capture, every check's value against
its threshold; then the largest value each check reached. A clean capture must have no failed
finding in any stage. resnet18's optimizer state (7 times its 45 MB of weights) is over the
default max_state_bytes, so its step is not redone: the optimizer's margin is the ViT's.

    PYTHONPATH=build/python:python/tests CAPSULE_CLI=build/cli/capsule \\
        /usr/bin/python3 bench/classifier_margins.py [SEEDS]

SEEDS (default 2): seeds 1..SEEDS of each model and optimizer. A replay whose diagnosis is not
NO_DIVERGENCE counts as a false finding too.
"""
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import torch

import capsule
import vision_models


def batch(seed):
    return vision_models.batch(seed, objective="classification")


def run(work, keys, arch, optimizer, seed, steps):
    config = {"arch": arch, "seed": seed}
    net = vision_models.make(config)
    monitor = capsule.Monitor(capsule_dir=str(work / f"{arch}-{optimizer}-{seed}"),
                              signing_key=str(keys[0]), log_sink=lambda line: None)
    monitor.attach(vision_models.model_of(net, config))
    make = torch.optim.AdamW if optimizer == "adamw" else torch.optim.Adam
    opt = make(net.parameters(), lr=1e-3, weight_decay=0.01)
    probe = monitor.attach_optimizer(opt, net.named_parameters())
    for step in range(steps):
        b = batch(1000 * seed + step)
        opt.zero_grad()
        with monitor.step(step, batch=b) as s:
            loss = torch.nn.functional.cross_entropy(net(b["inputs"]), b["labels"])
            loss.backward()
            s.end(loss=loss)
            if step == steps - 1:
                s.capture_now("margins")
        report = probe.step()
    r = subprocess.run([sys.executable, "-m", "capsule", "replay", report["capsule_path"],
                        "--model", "vision_models:factory", "--pubkey", str(keys[1]), "--json"],
                       capture_output=True, text=True)
    return json.loads(r.stdout)


def main():
    seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    worst, failed, runs, diagnosed = {}, 0, 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        subprocess.run([os.environ.get("CAPSULE_CLI", "capsule"), "keygen", "--out",
                        str(work / "k")], check=True, capture_output=True)
        keys = (work / "k.key", work / "k.pub")
        for arch in ("resnet18", "vit"):
            for optimizer in ("adamw", "adam"):
                for seed in range(1, seeds + 1):
                    d = run(work, keys, arch, optimizer, seed, steps=3)
                    runs += 1
                    diagnosed += d.get("diagnosis") != "NO_DIVERGENCE"
                    line = []
                    for st in d["stages"]:
                        for f in st.get("findings", []):
                            failed += bool(f.get("failed"))
                            if f["check"] in ("objective.loss_matches",
                                              "objective.trainer_loss_matches",
                                              "optimizer.update_matches"):
                                v = f.get("value", 0)
                                worst[f["check"]] = max(worst.get(f["check"], 0), v)
                                line.append(f"{f['check']}={v:.3g}/{f.get('threshold', 0):.3g}")
                    print(f"{arch} {optimizer} seed {seed}: {d.get('diagnosis')} " + " ".join(line))
    print(f"{runs} captures, {failed} failed findings, {diagnosed} diagnoses other than "
          "NO_DIVERGENCE")
    for check, v in sorted(worst.items()):
        print(f"  {check}: largest {v:.3g}")
    return 1 if failed or diagnosed else 0


if __name__ == "__main__":
    sys.exit(main())
