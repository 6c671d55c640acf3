#!/usr/bin/python3
"""What arming capsule costs a Python training step, next to torch's anomaly mode.

Times py_tiny_gpt's step (forward through the stages, backward, grad norm, Adam) three ways,
interleaved in rounds so that machine noise hits each alike: unarmed; armed (inside
``monitor.step(...)`` with ``s.end(loss=..., grad_norm=...)``); and under
``torch.autograd.detect_anomaly()``. Prints the median per-step time of each and the ratios to
unarmed. Budget (README, Python): armed / unarmed <= 1.02.

    PYTHONPATH=build/python:samples/py_tiny_gpt /usr/bin/python3 bench/python_step_bench.py
"""
import statistics
import warnings
import sys
import tempfile
import time

import torch

import capsule
import py_tiny_gpt as ptg


def main(rounds=7, steps=20):
    warnings.filterwarnings("ignore", message="Anomaly Detection has been enabled")
    torch.set_num_threads(1)
    net = ptg.PyTinyGpt({"n_layers": 4, "seed": 0})
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    loader = ptg.Loader(8, 32, 0)
    stages = ptg.stages(net)
    with tempfile.TemporaryDirectory() as d:
        monitor = capsule.Monitor(capsule_dir=d, log_sink=lambda line: None)
        monitor.attach(ptg.engine_model(net))
        step_no = [0]

        def one(mode):
            x, y, cursor = loader.next()
            optimizer.zero_grad()

            def body():
                h = x
                for _, fn in stages[:-1]:
                    h = fn(net, h, {"labels": y})
                loss = stages[-1][1](net, h, {"labels": y})
                loss.backward()
                return loss, ptg.grad_norm(net)

            if mode == "armed":
                with monitor.step(step_no[0], batch={"input_ids": x, "labels": y},
                                  cursor=cursor) as s:
                    loss, gn = body()
                    s.end(loss=loss, grad_norm=gn)
            elif mode == "anomaly":
                with torch.autograd.detect_anomaly():
                    body()
            else:
                body()
            optimizer.step()
            step_no[0] += 1

        times = {"unarmed": [], "armed": [], "anomaly": []}
        for mode in times:  # warm-up
            one(mode)
        for _ in range(rounds):
            for mode in times:
                start = time.perf_counter()
                for _ in range(steps):
                    one(mode)
                times[mode].append((time.perf_counter() - start) / steps)
        med = {m: statistics.median(t) for m, t in times.items()}
        for m, t in med.items():
            print(f"{m:8s} {t * 1e3:7.2f} ms/step  ({t / med['unarmed']:.3f}x unarmed; "
                  f"{rounds} rounds of {steps} steps, median)")
        print(f"triggers: {monitor.capsules_written} capsule(s) written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
