#!/usr/bin/python3
"""False-trigger and detection rates of the Monitor's default spike triggers, on real runs.

Runs the tiny_gpt sample trainer (capsule-tiny-gpt) many times with its default MonitorOptions:
clean runs over a grid of seeds, depths and batch sizes (every trigger there is a false one), and
runs with a `bad-batch` fault (one batch with every sample's labels corrupted; the trigger should fire at that
step). Prints one line per run and the totals; `--json FILE` keeps the numbers.

  bench/trigger_rates.py build/samples/capsule-tiny-gpt [--steps 200] [--quick]
      [--only-mlp] [--mlp build-mlp/mlp_train] [--layers 2,4] [--batches 3,4,8,16,32]

--mlp adds a second model: samples/mlp (a two-layer MLP on noisy regression; build it as the
README's "Writing a model" shows), 50 clean runs (batches 3-32, seeds 1-10) and 15 with a
corrupted-label batch. --only-mlp skips tiny_gpt. --layers and --batches pick part of the
tiny_gpt grid (a long grid can be run in pieces).
"""
import re
import argparse
import csv
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time


def run(trainer, workdir, name, steps, layers, batch, seed, extra=()):
    out = os.path.join(workdir, name + ".csv")
    cmd = [trainer, "train", "--quiet", "--steps", str(steps), "--layers", str(layers),
           "--batch-size", str(batch), "--seed", str(seed), "--capsule-dir",
           os.path.join(workdir, name), "--run-name", name, "--scalars-out", out, *extra]
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    rows = list(csv.DictReader(open(out)))
    return {"name": name, "layers": layers, "batch": batch, "seed": seed,
            "seconds": round(time.monotonic() - t0, 1),
            "triggers": [(int(r["step"]), r["trigger"]) for r in rows if r["trigger"]],
            "loss": [float(r["loss"]) for r in rows],
            "grad_norm": [float(r["grad_norm"]) for r in rows]}


def run_mlp(mlp, workdir, name, steps, batch, seed, bad_step=-1):
    """One samples/mlp run; its triggers are read from the Monitor's log lines."""
    cmd = [mlp, os.path.join(workdir, name), str(steps), "1", str(batch), str(seed), str(bad_step)]
    t0 = time.monotonic()
    p = subprocess.run(cmd, check=True, capture_output=True, text=True)
    triggers = [(int(m.group(2)), m.group(1))
                for m in re.finditer(r"^capsule: ([A-Z_]+) at step (\d+)", p.stderr, re.M)]
    return {"name": name, "model": "mlp", "batch": batch, "seed": seed,
            "seconds": round(time.monotonic() - t0, 1), "triggers": triggers}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trainer")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--quick", action="store_true", help="a small grid (smoke test)")
    ap.add_argument("--json", help="write every run's series and triggers here")
    ap.add_argument("--mlp", help="samples/mlp's mlp_train: measure a second model too")
    ap.add_argument("--only-mlp", action="store_true", help="skip the tiny_gpt grid")
    ap.add_argument("--layers", default="2,4", help="tiny_gpt depths of the grid")
    ap.add_argument("--batches", default="3,4,8,16,32", help="tiny_gpt batch sizes of the grid")
    a = ap.parse_args()
    depths = [int(x) for x in a.layers.split(",")]
    batches = [int(x) for x in a.batches.split(",")]
    if a.quick:
        clean_grid = list(itertools.product([2], [3, 16], [1]))
        fault_grid = list(itertools.product([2], [8], [1]))
    else:
        clean_grid = list(itertools.product(depths, batches, [1, 2, 3, 4, 5]))
        fault_grid = list(itertools.product(depths, [4, 16], [1, 2, 3]))
    if a.only_mlp:
        clean_grid, fault_grid = [], []
    results = {"clean": [], "bad_data": []}
    with tempfile.TemporaryDirectory() as work:
        for layers, batch, seed in clean_grid:
            r = run(a.trainer, work, f"clean-L{layers}-B{batch}-S{seed}", a.steps, layers, batch,
                    seed)
            results["clean"].append(r)
            print(f"clean     layers {layers} batch {batch:2d} seed {seed}: "
                  f"{len(r['triggers'])} trigger(s) {r['triggers']}", flush=True)
        for layers, batch, seed in fault_grid:
            inject_step = 60 + 20 * seed
            r = run(a.trainer, work, f"bad-L{layers}-B{batch}-S{seed}", min(a.steps, inject_step + 5),
                    layers, batch, seed, ["--inject", "bad-batch", "--inject-step", str(inject_step)])
            r["inject_step"] = inject_step
            r["detected"] = any(s == inject_step for s, _ in r["triggers"])
            r["false"] = [t for t in r["triggers"] if t[0] != inject_step]
            results["bad_data"].append(r)
            print(f"bad-data  layers {layers} batch {batch:2d} seed {seed} at step {inject_step}: "
                  f"{'detected' if r['detected'] else 'MISSED'}; other triggers {r['false']}",
                  flush=True)
        if a.mlp:
            for batch, seed in itertools.product([3, 4, 8, 16, 32], range(1, 11)):
                r = run_mlp(a.mlp, work, f"mlp-clean-B{batch}-S{seed}", a.steps, batch, seed)
                results["clean"].append(r)
                print(f"clean     mlp batch {batch:2d} seed {seed:2d}: "
                      f"{len(r['triggers'])} trigger(s) {r['triggers']}", flush=True)
            for batch, seed in itertools.product([4, 8, 16, 32, 3], [1, 2, 3]):
                bad = 60 + 20 * seed
                r = run_mlp(a.mlp, work, f"mlp-bad-B{batch}-S{seed}", bad + 5, batch, seed, bad)
                r["inject_step"] = bad
                r["detected"] = any(s == bad for s, _ in r["triggers"])
                r["false"] = [t for t in r["triggers"] if t[0] != bad]
                results["bad_data"].append(r)
                print(f"bad-data  mlp batch {batch:2d} seed {seed} at step {bad}: "
                      f"{'detected' if r['detected'] else 'MISSED'}; other triggers {r['false']}",
                      flush=True)
    clean_runs = len(results["clean"])
    false_runs = sum(1 for r in results["clean"] if r["triggers"])
    detected = sum(1 for r in results["bad_data"] if r["detected"])
    print(f"false triggers: {false_runs} of {clean_runs} clean runs of {a.steps} steps "
          f"({sum(len(r['triggers']) for r in results['clean'])} triggers in all)")
    print(f"detection: bad-data spike caught in {detected} of {len(results['bad_data'])} runs")
    if a.json:
        json.dump(results, open(a.json, "w"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
