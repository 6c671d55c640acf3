"""py_tiny_gpt: the tiny_gpt sample as a Python trainer, hooked to capsule from Python.

A small byte-level GPT (the C++ sample's corpus and tokenizer: token id = byte) with pre-LN blocks,
trained with Adam under ``capsule.Monitor``. It is described to capsule as named stages (embed,
blocks.0..N-1, ln_f, lm_head, loss); the optimized path is the float32 module, the reference a
float64 copy. Faults, each a change of one stage on the optimized (float32) path only, like the
C++ sample's (samples/tiny_gpt/faults.h):

    nan               the stage writes NaN into its output from the step on
    softmax-overflow  the block's attention logits grow by 1e4 (both paths) and its float32
                      softmax skips the max subtraction, so exp() overflows
    tail-block        the block's layer norms skip the n % 24 tail of the features in their mean
    eps               the block's layer norms use eps 1e-1 instead of 1e-5
    bad-data          sample 0's labels are corrupted at the step (not a layer fault)
    transient         a NaN like ``nan`` on the first execution of that one step only

    python3 samples/py_tiny_gpt/py_tiny_gpt.py --steps 8 --inject nan --inject-layer blocks.1 \\
        --inject-step 5 --capsule-dir caps --key trainer.key
    python3 -P -m capsule replay caps/*.capsule --model py_tiny_gpt:factory --pubkey trainer.pub
"""
import argparse
import math
import os
import random
import sys

import torch
import torch.nn.functional as F
from torch import nn

import capsule

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "..", "tiny_gpt", "data", "corpus.txt")
TILE = 24  # d_model 64 = 2 tiles and a tail of 16
FAULTY_EPS = 1e-1
OVERFLOW_GAIN = 1e4


def fault_active(net, stage, kind):
    f = net.fault
    if f["kind"] != kind or f["layer"] != stage:
        return False
    if kind == "transient":
        return net.fault_armed and net.step == f["step"]
    return net.step >= f["step"]


def layer_norm(x, ln, eps, drop_tail):
    if not drop_tail:
        return F.layer_norm(x, ln.normalized_shape, ln.weight, ln.bias, eps)
    keep = (x.shape[-1] // TILE) * TILE
    head = x[..., :keep]
    mean = head.mean(-1, keepdim=True)
    var = ((head - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * ln.weight + ln.bias


class Embed(nn.Module):
    def __init__(self, vocab, d, seq_len):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq_len, d)

    def forward(self, ids):
        return self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x, eps=1e-5, drop_tail=False, gain=1.0, unstable_softmax=False):
        b, t, d = x.shape
        h = layer_norm(x, self.ln1, eps, drop_tail)
        q, k, v = self.qkv(h).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-2, -1)) * (gain / math.sqrt(d // self.heads))
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
        if unstable_softmax:
            e = torch.exp(scores)
            att = e / e.sum(-1, keepdim=True)
        else:
            att = torch.softmax(scores, -1)
        y = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return y + self.fc2(F.gelu(self.fc1(layer_norm(y, self.ln2, eps, drop_tail))))


class PyTinyGpt(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = dict(config)
        c = self.config
        torch.manual_seed(c.get("seed", 0))
        self.embed = Embed(256, c.get("d_model", 64), c.get("seq_len", 32))
        self.blocks = nn.ModuleList(
            Block(c.get("d_model", 64), c.get("n_heads", 4)) for _ in range(c.get("n_layers", 4)))
        self.ln_f = nn.LayerNorm(c.get("d_model", 64))
        self.lm_head = nn.Linear(c.get("d_model", 64), 256, bias=False)
        self.fault = dict(c.get("fault", {"kind": "none", "layer": "", "step": 0}))
        self.step = c.get("step", 0)
        self.fault_armed = c.get("fault_armed", True)

    def spec(self):
        """The config replay rebuilds the model from, with the runtime fault state."""
        return dict(self.config, fault=self.fault, step=self.step, fault_armed=self.fault_armed)


def poison(net, stage, x):
    """The nan and transient faults, on the optimized (float32) path only."""
    if x.dtype != torch.float32:
        return x
    if fault_active(net, stage, "nan") or fault_active(net, stage, "transient"):
        if net.fault["kind"] == "transient":
            net.fault_armed = False
        x = x.clone()
        x.view(-1)[:64] = float("nan")
    return x


def stages(net):
    """The named stages of PyTinyGpt, for capsule.Model. Faults read ``net`` (the trainer's
    module, whose step and fault state they follow) and act on float32 only."""

    def block(i):
        name = f"blocks.{i}"

        def run(m, x, batch):
            opt = x.dtype == torch.float32
            eps = FAULTY_EPS if opt and fault_active(net, name, "eps") else 1e-5
            gain = OVERFLOW_GAIN if fault_active(net, name, "softmax-overflow") else 1.0
            out = m.blocks[i](x, eps=eps, drop_tail=opt and fault_active(net, name, "tail-block"),
                              gain=gain,
                              unstable_softmax=opt and fault_active(net, name, "softmax-overflow"))
            return poison(net, name, out)

        return name, run

    def simple(name, fn):
        return name, lambda m, x, batch: poison(net, name, fn(m, x, batch))

    out = [simple("embed", lambda m, x, b: m.embed(x))]
    out += [block(i) for i in range(len(net.blocks))]
    out.append(simple("ln_f", lambda m, x, b: m.ln_f(x)))
    out.append(simple("lm_head", lambda m, x, b: m.lm_head(x)))
    out.append(("loss", lambda m, x, b: F.cross_entropy(
        x.reshape(-1, x.shape[-1]), b["labels"].reshape(-1).to(torch.long), ignore_index=-100)))
    return out


def engine_model(net):
    return capsule.Model("py_tiny_gpt", net, stages(net), config=net.spec)


def factory(config):
    """Replay's factory: ``python3 -P -m capsule replay FILE --model py_tiny_gpt:factory``."""
    return engine_model(PyTinyGpt(config))


class Loader:
    """Windows of seq_len + 1 bytes at offsets drawn by a seeded RNG, as the C++ sample's loader."""

    def __init__(self, batch_size, seq_len, seed):
        with open(CORPUS, "rb") as f:
            self.data = torch.tensor(list(f.read()), dtype=torch.long)
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.rng = random.Random(seed)
        self.served = 0

    def state(self):
        return repr(self.rng.getstate()).encode()

    def next(self):
        starts = [self.rng.randrange(len(self.data) - self.seq_len - 1)
                  for _ in range(self.batch_size)]
        windows = torch.stack([self.data[s:s + self.seq_len + 1] for s in starts])
        cursor = {"offset": self.served, "sample_indices": starts, "sampler_rng": "sampler"}
        self.served += self.batch_size
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous(), cursor


def grad_norm(net):
    sq = sum(float(p.grad.double().pow(2).sum()) for p in net.parameters() if p.grad is not None)
    return math.sqrt(sq)


def train(args):
    torch.set_num_threads(1)
    config = {"n_layers": args.layers, "seed": args.seed, "d_model": 64, "n_heads": 4,
              "seq_len": 32,
              "fault": {"kind": args.inject, "layer": args.inject_layer, "step": args.inject_step}}
    net = PyTinyGpt(config)
    optimizer = torch.optim.Adam(net.parameters(), lr=args.lr)
    monitor = capsule.Monitor(capsule_dir=args.capsule_dir, signing_key=args.key,
                              run_name=args.run_name, log_sink=lambda line: None)
    monitor.attach(engine_model(net))
    data = os.path.join(HERE, "..", "tiny_gpt", "data")
    error = monitor.set_identity([("tokenizer", os.path.join(data, "tokenizer.json")),
                                  ("chat_template", os.path.join(data, "chat_template.txt")),
                                  ("corpus", CORPUS)])
    if error:
        print(f"capsule: {error}", file=sys.stderr)  # capsules lack those hashes; training goes on
    loader = Loader(args.batch_size, 32, args.seed)
    monitor.register_rng("sampler", loader.state, args.seed)
    monitor.register_python_rngs()
    triggers = 0
    for step in range(args.steps):
        net.step = step
        x, y, cursor = loader.next()
        if args.inject == "bad-data" and step == args.inject_step:
            y = y.clone()
            y[0] = y[0] ^ 0x80
        optimizer.zero_grad()
        loss_value = float("nan")
        with monitor.step(step, batch={"input_ids": x, "labels": y}, cursor=cursor,
                          sample_ids=[f"byte:{i}" for i in cursor["sample_indices"]]) as s:
            h = x
            for _, fn in stages(net)[:-1]:
                h = fn(net, h, {"labels": y})
            loss = stages(net)[-1][1](net, h, {"labels": y})
            loss.backward()
            loss_value = float(loss.item())
            gn = grad_norm(net)
            s.end(loss=loss_value, grad_norm=gn, learning_rate=args.lr)
            if step == args.capture_at_step:
                s.capture_now(f"--capture-at-step {step}")
        report = s.report
        if report["triggered"]:
            triggers += 1
            print(f"  {report['summary']}")
        if not args.quiet and (step % 10 == 0 or step + 1 == args.steps):
            print(f"step {step:3d}  loss {loss_value:.4f}")
        if s.exception is None and math.isfinite(loss_value) and math.isfinite(grad_norm(net)):
            optimizer.step()
    print(f"trained {args.steps} steps; {triggers} trigger(s), {monitor.capsules_written} "
          f"capsule(s) in {args.capsule_dir}")
    return 0


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--capsule-dir", default="capsules")
    p.add_argument("--key", default="")
    p.add_argument("--run-name", default="pytiny")
    p.add_argument("--capture-at-step", type=int, default=-1)
    p.add_argument("--inject", default="none",
                   choices=["none", "nan", "softmax-overflow", "tail-block", "eps", "bad-data",
                            "transient"])
    p.add_argument("--inject-layer", default="")
    p.add_argument("--inject-step", type=int, default=0)
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(train(parse(sys.argv[1:])))
