#!/usr/bin/python3
"""False-trigger and detection rates of the spike rule (capture/spike_rule.h) on three models.

Trains three small models on the CPU, many seeds each, and records every step's loss and gradient
norm: tiny_gpt (samples/py_tiny_gpt's PyTinyGpt, byte-level, 2 blocks), a Llama-like decoder
(RMSNorm, rotary attention, SwiGLU, no biases) on right-padded sequences of varying length whose
pads are ignored by the loss, and a small ViT on synthetic 8x8 images of 10 classes (a clean run
settles at 0.005-0.03, where ordinary batches are many times the median loss). At fixed probe steps each run also measures, without training on them,
the loss and gradient norm of faulty batches:

    garbage      a batch all garbage (random tokens / uniform noise images)
    bad-data     a batch part garbage (random tokens / noise images), mixed to ~5x the median of
                 the last 20 losses (all garbage where that is not enough; its ratio is recorded)
    label-noise  the same inputs with their labels shuffled across the batch (LM: another
                 sequence's next tokens; ViT: random classes)
    nan          the loss is NaN (the non-finite trigger's case)

Each rule is then run over the recorded series exactly as the Monitor checks a step (the
non-finite triggers, then the loss spike, then the grad-norm spike, each threshold from
capsule.spike_threshold on the values before the step). A clean step that fires is a false
trigger; a probe that fires is a detection. Rules compared: `old` (the median/MAD rule before
detrending and the absolute bounds: detrend off, min_rise and max_rise 0) and `new` (MonitorOptions' defaults).

  PYTHONPATH=build/python /usr/bin/python3 bench/spike_rule_rates.py [--seeds 30] [--steps 300]
      [--models tiny_gpt,llama,vit] [--save series.json | --load series.json] [--rule k=v ...]

--save keeps the recorded series, --load evaluates saved ones without training again, and
--rule loss.k=v / grad.k=v adds a third rule (the defaults with those fields changed).
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F
from functorch import combine_state_for_ensemble, grad_and_value, vmap
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "samples", "py_tiny_gpt"))

import capsule  # noqa: E402
import py_tiny_gpt as ptg  # noqa: E402

PROBES = [55, 65, 80, 100, 130, 170, 220, 280]
BAD_RATIO = 5.0


# --- models: each an nn.Module whose forward(x, y) is the per-sample loss -----------------------

def lin(layer, x):
    """layer(x) on 2-D input (functorch's batched linear with a bias is slow on more dims)."""
    return F.linear(x.reshape(-1, x.shape[-1]), layer.weight, layer.bias).view(
        *x.shape[:-1], -1)


def attention(q, k, v, mask):
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    return torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ v


class TinyGptLoss(nn.Module):
    """samples/py_tiny_gpt's PyTinyGpt (2 pre-LN blocks, d 32, byte-level), its Block.forward
    written with lin()."""
    vocab = 256

    def __init__(self, seed):
        super().__init__()
        self.gpt = ptg.PyTinyGpt({"n_layers": 2, "seed": seed, "d_model": 32, "n_heads": 2,
                                  "seq_len": 16})

    @staticmethod
    def block(m, x):
        b, t, d = x.shape
        q, k, v = lin(m.qkv, m.ln1(x)).view(b, t, 3, m.heads, d // m.heads).permute(2, 0, 3, 1, 4)
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        y = x + lin(m.proj, attention(q, k, v, mask).transpose(1, 2).reshape(b, t, d))
        return y + lin(m.fc2, F.gelu(lin(m.fc1, m.ln2(y))))

    def forward(self, x, y):
        h = self.gpt.embed(x)
        for b in self.gpt.blocks:
            h = self.block(b, h)
        logits = lin(self.gpt.lm_head, self.gpt.ln_f(h))
        return F.cross_entropy(logits.reshape(-1, self.vocab), y.reshape(-1),
                               reduction="none").view(y.shape).mean(1)


class RmsNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w


def rotary(x):
    t, d = x.shape[-2], x.shape[-1]
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = torch.arange(t, dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = ang.cos(), ang.sin()
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], -1).flatten(-2)


class LlamaBlock(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.n1, self.n2 = RmsNorm(d), RmsNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.gate = nn.Linear(d, 2 * d, bias=False)
        self.up = nn.Linear(d, 2 * d, bias=False)
        self.down = nn.Linear(2 * d, d, bias=False)

    def forward(self, x, mask):
        b, t, d = x.shape
        q, k, v = lin(self.qkv, self.n1(x)).view(b, t, 3, self.heads, d // self.heads).permute(
            2, 0, 3, 1, 4)
        x = x + lin(self.o, attention(rotary(q), rotary(k), v, mask).transpose(1, 2).reshape(b, t, d))
        h = self.n2(x)
        return x + lin(self.down, F.silu(lin(self.gate, h)) * lin(self.up, h))


class LlamaLoss(nn.Module):
    """A Llama-like decoder (RMSNorm, rotary attention, SwiGLU, no biases; 2 blocks, d 48) on
    right-padded sequences: pads (label -100) are masked from attention and the loss, and each
    sample's loss is the mean over its real tokens."""
    vocab = 256

    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = nn.Embedding(self.vocab, 32)
        self.blocks = nn.ModuleList(LlamaBlock(32, 2) for _ in range(2))
        self.norm = RmsNorm(32)
        self.head = nn.Linear(32, self.vocab, bias=False)

    def forward(self, x, y):
        keep = y != -100
        t = x.shape[1]
        mask = (torch.ones(t, t, dtype=torch.bool).tril()[None, None] & keep[:, None, None, :]) \
            | torch.eye(t, dtype=torch.bool)[None, None]  # a pad attends to itself
        h = self.emb(x)
        for b in self.blocks:
            h = b(h, mask)
        logits = lin(self.head, self.norm(h))
        logp = torch.log_softmax(logits, -1).gather(-1, y.clamp(min=0)[..., None])[..., 0]
        return -(logp * keep).sum(1) / keep.sum(1).clamp(min=1)


class VitBlock(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.o = nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = lin(self.qkv, self.n1(x)).view(b, t, 3, self.heads, d // self.heads).permute(
            2, 0, 3, 1, 4)
        mask = torch.ones(t, t, dtype=torch.bool)
        x = x + lin(self.o, attention(q, k, v, mask).transpose(1, 2).reshape(b, t, d))
        return x + lin(self.fc2, F.gelu(lin(self.fc1, self.n2(x))))


class VitLoss(nn.Module):
    """A patch-4 ViT (class token, 2 pre-LN blocks, d 48) on 3x16x16 images, 10 classes."""

    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.patch = nn.Conv2d(3, 32, 4, 4)
        self.cls = nn.Parameter(torch.zeros(1, 1, 32))
        self.pos = nn.Parameter(torch.randn(1, 5, 32) * 0.02)
        self.blocks = nn.ModuleList(VitBlock(32, 2) for _ in range(2))
        self.norm = nn.LayerNorm(32)
        self.head = nn.Linear(32, 10)

    def forward(self, x, y):
        p = self.patch(x).flatten(2).transpose(1, 2)
        h = torch.cat([self.cls.expand(x.shape[0], -1, -1), p], 1) + self.pos
        for b in self.blocks:
            h = b(h)
        return F.cross_entropy(self.head(self.norm(h)[:, 0]), y, reduction="none")


# --- data and faults, one stream per seed -------------------------------------------------------

class ByteData:
    """The tiny_gpt corpus in windows of 32 (samples/py_tiny_gpt's Loader); `padded` cuts each
    sample to 8-32 tokens and right-pads it (input 0, label -100)."""

    def __init__(self, seed, batch, padded):
        self.loader = ptg.Loader(batch, 16, seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.padded = padded

    def batch(self):
        x, y, _ = self.loader.next()
        if self.padded:
            lengths = torch.randint(4, 17, (x.shape[0],), generator=self.gen)
            pad = torch.arange(x.shape[1])[None, :] >= lengths[:, None]
            x, y = x.masked_fill(pad, 0), y.masked_fill(pad, -100)
        return x, y

    def garbage(self, x, y):
        """Random bytes in, random bytes out, on the same (unpadded) positions."""
        keep = y != -100
        return (torch.randint(1, 256, x.shape, generator=self.gen).masked_fill(~keep, 0),
                torch.randint(1, 256, y.shape, generator=self.gen).masked_fill(~keep, -100))

    def shuffled_labels(self, x, y):
        """Each sample's labels from the next sample (next tokens of another text)."""
        keep, rolled = y != -100, y.roll(1, 0)
        return x, torch.where(keep, torch.where(rolled == -100, y, rolled), -100)


class ImageData:
    """Synthetic images: a fixed random template per class (per seed) plus noise of sd 1; a clean
    run settles at 0.005-0.03."""

    def __init__(self, seed, batch, padded=False):
        self.templates = torch.randn(10, 3, 8, 8,
                                     generator=torch.Generator().manual_seed(1000 + seed))
        self.gen = torch.Generator().manual_seed(seed)
        self.size = batch

    def batch(self):
        y = torch.randint(0, 10, (self.size,), generator=self.gen)
        return self.templates[y] + torch.randn(self.size, 3, 8, 8, generator=self.gen), y

    def garbage(self, x, y):
        """Uniform noise in [-2, 2) (a corrupt decode), labels kept."""
        return 4 * torch.rand(x.shape, generator=self.gen) - 2, y

    def shuffled_labels(self, x, y):
        return x, torch.randint(0, 10, y.shape, generator=self.gen)


# name: (module, data, padded, learning rate, batch sizes: seeds cycle through them)
MODELS = {"tiny_gpt": (TinyGptLoss, ByteData, False, 3e-3, [4, 8, 16]),
          "llama": (LlamaLoss, ByteData, True, 3e-3, [4, 8, 16]),
          "vit": (VitLoss, ImageData, False, 3e-3, [8, 16, 32])}


# --- recording: the seeds of one batch size train side by side (functorch), each with its own
# weights, data and Adam state, exactly as separate runs would ---------------------------------

class Ensemble:
    def __init__(self, name, seeds):
        module, data, padded, self.lr, batches = MODELS[name]
        self.fmodel, params, self.buffers = combine_state_for_ensemble(
            [module(s) for s in seeds])
        self.params = [p.detach().clone() for p in params]
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]
        self.t = 0
        batch = batches[seeds[0] % len(batches)]
        self.data = [data(s, batch, padded) for s in seeds]

        def mixed(p, b, x, y, gx, gy, w):
            return (1 - w) * self.fmodel(p, b, x, y).mean() + w * self.fmodel(p, b, gx, gy).mean()

        self.step_fn = vmap(grad_and_value(lambda p, b, x, y: self.fmodel(p, b, x, y).mean()))
        self.mixed_fn = vmap(grad_and_value(mixed))
        self.loss_fn = vmap(lambda p, b, x, y: self.fmodel(p, b, x, y).mean())

    def stack(self, pairs):
        return torch.stack([a for a, _ in pairs]), torch.stack([b for _, b in pairs])

    @staticmethod
    def norms(grads):
        sq = sum(g.double().pow(2).flatten(1).sum(1) for g in grads)
        return sq.sqrt().tolist()

    def adam(self, grads, b1=0.9, b2=0.999, eps=1e-8):
        """torch.optim.Adam's update, elementwise, so each seed's slice is its own run's."""
        self.t += 1
        c1, c2 = 1 - b1 ** self.t, 1 - b2 ** self.t
        for p, g, m, v in zip(self.params, grads, self.m, self.v):
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            p.sub_(self.lr / c1 * m / (v.sqrt() / math.sqrt(c2) + eps))


def record(name, seeds, steps):
    e = Ensemble(name, seeds)
    p = tuple(e.params)
    runs = [{"model": name, "seed": s, "loss": [], "grad_norm": [], "probes": []} for s in seeds]
    for step in range(steps):
        pairs = [d.batch() for d in e.data]
        x, y = e.stack(pairs)
        if step in PROBES:
            medians = [sorted(r["loss"][-20:])[len(r["loss"][-20:]) // 2] for r in runs]
            gx, gy = e.stack([d.garbage(*xy) for d, xy in zip(e.data, pairs)])
            with torch.no_grad():
                clean, junk = e.loss_fn(p, e.buffers, x, y), e.loss_fn(p, e.buffers, gx, gy)
            target = BAD_RATIO * torch.tensor(medians)
            w = ((target - clean) / (junk - clean).clamp(min=1e-12)).clamp(0, 1)
            grads, bad = e.mixed_fn(p, e.buffers, x, y, gx, gy, w)
            jgrads, junked = e.step_fn(p, e.buffers, gx, gy)
            lx, ly = e.stack([d.shuffled_labels(*xy) for d, xy in zip(e.data, pairs)])
            ngrads, noisy = e.step_fn(p, e.buffers, lx, ly)
            for r, med, bl, bg, jl, jg, nl, ng in zip(
                    runs, medians, bad.tolist(), e.norms(grads), junked.tolist(),
                    e.norms(jgrads), noisy.tolist(), e.norms(ngrads)):
                r["probes"] += [
                    {"step": step, "kind": "garbage", "loss": jl, "grad_norm": jg,
                     "ratio": jl / med, "rise": jl - med},
                    {"step": step, "kind": "bad-data", "loss": bl, "grad_norm": bg,
                     "ratio": bl / med, "rise": bl - med},
                    {"step": step, "kind": "label-noise", "loss": nl, "grad_norm": ng,
                     "ratio": nl / med, "rise": nl - med},
                    {"step": step, "kind": "nan", "loss": float("nan"),
                     "grad_norm": float("nan"), "ratio": float("nan")}]
        grads, loss = e.step_fn(p, e.buffers, x, y)
        for r, l, g in zip(runs, loss.tolist(), e.norms(grads)):
            r["loss"].append(l)
            r["grad_norm"].append(g)
        e.adam(grads)
    return runs


# --- evaluation ---------------------------------------------------------------------------------

def fires(rule, loss_hist, grad_hist, loss, gn, worst=None):
    """The Monitor's CheckTriggers, in its order; the kind that fires or None. `worst` keeps the
    largest value / threshold seen per scalar."""
    if not math.isfinite(loss):
        return "NON_FINITE_LOSS"
    if not math.isfinite(gn):
        return "NON_FINITE_GRAD"
    lt = capsule.spike_threshold(loss_hist, "loss", **rule["loss"])
    gt = capsule.spike_threshold(grad_hist, "grad_norm", **rule["grad"])
    if worst is not None:
        worst["loss"] = max(worst["loss"], loss / lt if lt else 0)
        worst["grad"] = max(worst["grad"], gn / gt if gt else 0)
    if lt is not None and loss > lt:
        return "LOSS_SPIKE"
    if gt is not None and gn > gt:
        return "GRAD_NORM_SPIKE"
    return None


def evaluate(runs, rule, history):
    out = {}
    for r in runs:
        m = out.setdefault(r["model"], {"runs": 0, "false_runs": 0, "false": 0,
                                        "caught": {}, "probes": {}, "missed": [],
                                        "worst": {"loss": 0, "grad": 0}})
        m["runs"] += 1
        fired = 0
        for s in range(1, len(r["loss"])):
            lo = max(0, s - history)
            if fires(rule, r["loss"][lo:s], r["grad_norm"][lo:s], r["loss"][s], r["grad_norm"][s],
                     m["worst"]):
                fired += 1
        m["false"] += fired
        m["false_runs"] += fired > 0
        for p in r["probes"]:
            s, lo = p["step"], max(0, p["step"] - history)
            hit = fires(rule, r["loss"][lo:s], r["grad_norm"][lo:s], p["loss"], p["grad_norm"])
            m["probes"][p["kind"]] = m["probes"].get(p["kind"], 0) + 1
            m["caught"][p["kind"]] = m["caught"].get(p["kind"], 0) + (hit is not None)
            if not hit:
                m["missed"].append((r["seed"], s, p["kind"], round(p["ratio"], 2)))
    return out


def parse_rule(pairs):
    rule = {"loss": {}, "grad": {}}
    for kv in pairs:
        key, value = kv.split("=", 1)
        which, field = key.split(".", 1)
        rule[which][field] = value.lower() == "true" if value.lower() in ("true", "false") \
            else float(value) if "." in value or "e" in value else int(value)
    return rule


OLD = {"loss": {"detrend": False, "min_rise": 0.0, "max_rise": 0.0, "window": 50, "warmup": 50, "mads": 6.0,
                "min_ratio": 2.0},
       "grad": {"detrend": False, "min_rise": 0.0, "max_rise": 0.0, "window": 50, "warmup": 50, "mads": 6.0,
                "min_ratio": 20.0}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--models", default="tiny_gpt,llama,vit")
    ap.add_argument("--save")
    ap.add_argument("--load")
    ap.add_argument("--history", type=int, default=64, help="MonitorOptions::history_length")
    ap.add_argument("--rule", nargs="*", default=[], help="a third rule: loss.k=v grad.k=v")
    ap.add_argument("--verbose", action="store_true", help="list every missed probe")
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.load:
        runs = json.load(open(a.load))
    else:
        runs = []
        for name in a.models.split(","):
            t0 = time.monotonic()
            batches = len(MODELS[name][4])
            for first in range(1, batches + 1):  # one ensemble per batch size
                runs += record(name, list(range(first, a.seeds + 1, batches)), a.steps)
            print(f"recorded {name}: {a.seeds} runs of {a.steps} steps in "
                  f"{time.monotonic() - t0:.0f} s", flush=True)
        if a.save:
            json.dump(runs, open(a.save, "w"))
    rules = [("old", OLD), ("new", {"loss": {}, "grad": {}})]
    if a.rule:
        rules.append(("custom " + " ".join(a.rule), parse_rule(a.rule)))
    for label, rule in rules:
        print(f"rule {label}:")
        for model, m in evaluate(runs, rule, a.history).items():
            caught = ", ".join(f"{k} {m['caught'][k]}/{m['probes'][k]}" for k in m["probes"])
            print(f"  {model:9s} clean runs with a false trigger {m['false_runs']}/{m['runs']} "
                  f"({m['false']} steps; worst clean step {m['worst']['loss']:.2f} of the loss "
                  f"threshold, {m['worst']['grad']:.2f} of the grad-norm one); detected: {caught}")
            if a.verbose and m["missed"]:
                print(f"    missed (seed, step, kind, x median): {m['missed']}")
    for model in dict.fromkeys(r["model"] for r in runs):
        spans = []
        for kind in ("garbage", "bad-data", "label-noise"):
            ps = [p for r in runs if r["model"] == model for p in r["probes"] if p["kind"] == kind]
            ratio, rise = [p["ratio"] for p in ps], [p["rise"] for p in ps]
            spans.append(f"{kind} {min(ratio):.1f}-{max(ratio):.1f}x ({min(rise):.2f}-"
                         f"{max(rise):.2f} nats)")
        print(f"  {model:9s} probes over the median of the last 20 losses: " + ", ".join(spans))
    return 0


if __name__ == "__main__":
    sys.exit(main())
