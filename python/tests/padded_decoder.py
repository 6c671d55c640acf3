"""A small Llama-like decoder (RMSNorm, rotary attention, SwiGLU, no biases) trained on
RIGHT-PADDED batches, as instruction-tuning and chat trainers feed them: the pad id 0 in the
inputs after each sample's real tokens, the labels (the next input, labels_shifted) the pad id or
-100 there, and the loss mask 0 there. Its data is learnable: each sample counts from a random
start in a random stride. `factory` is what `python3 -P -m capsule replay FILE --model
padded_decoder:factory` calls.

Faults, by config["fault"] (the optimized path only; the reference runs the clean stages):
"masked-softmax" fills masked attention scores with -inf, so a sample with no real token (all
padding) turns into NaN at blocks.<config["layer"]>; "detach" cuts the graph after that block."""
import torch
import torch.nn.functional as F

import capsule

PAD = 0


def config_of(**kw):
    c = {"seed": 0, "vocab": 48, "dim": 32, "heads": 2, "layers": 3, "seq": 16}
    c.update(kw)
    return c


class RMSNorm(torch.nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x):
    """Rotary position embedding over the last dimension of [batch, heads, seq, head_dim]."""
    t, d = x.shape[-2], x.shape[-1]
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=x.dtype) / d))
    angles = torch.arange(t, dtype=x.dtype)[:, None] * inv[None, :]
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Block(torch.nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.attn_norm = RMSNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim, bias=False)
        self.out = torch.nn.Linear(dim, dim, bias=False)
        self.mlp_norm = RMSNorm(dim)
        self.gate = torch.nn.Linear(dim, 2 * dim, bias=False)
        self.up = torch.nn.Linear(dim, 2 * dim, bias=False)
        self.down = torch.nn.Linear(2 * dim, dim, bias=False)

    def forward(self, x, attention_mask, masked_fill=None):
        b, t, d = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).split(d, dim=-1)
        shape = lambda z: z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        q, k, v = rotate(shape(q)), rotate(shape(k)), shape(v)
        scores = q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        allowed = causal[None, None] & attention_mask.bool()[:, None, None, :]
        fill = torch.finfo(scores.dtype).min if masked_fill is None else masked_fill
        attn = scores.masked_fill(~allowed, fill).softmax(-1)
        x = x + self.out((attn @ v).transpose(1, 2).reshape(b, t, d))
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Decoder(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed = torch.nn.Embedding(c["vocab"], c["dim"])
        self.blocks = torch.nn.ModuleList(Block(c["dim"], c["heads"]) for _ in range(c["layers"]))
        self.norm = RMSNorm(c["dim"])
        self.lm_head = torch.nn.Linear(c["dim"], c["vocab"], bias=False)


def token_mean_loss(logits, batch):
    """Cross-entropy averaged over the positions with a label (not -100) and the loss mask set."""
    labels = batch["labels"]
    keep = (labels != -100) & (batch["loss_mask"] != 0)
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.clamp_min(0).reshape(-1),
                          reduction="none").view(labels.shape)
    return torch.where(keep, nll, torch.zeros_like(nll)).sum() / keep.sum()


def stages_of(c, fault=None, layer=None):
    def block(i):
        def run(m, x, b):
            y = m.blocks[i](x, b["attention_mask"],
                            float("-inf") if fault == "masked-softmax" and i == layer else None)
            return y.detach() if fault == "detach" and i == layer else y
        return (f"blocks.{i}", run)
    return ([("embed", lambda m, x, b: m.embed(x))] + [block(i) for i in range(c["layers"])] +
            [("norm", lambda m, x, b: m.norm(x)), ("lm_head", lambda m, x, b: m.lm_head(x)),
             ("loss", lambda m, x, b: token_mean_loss(x, b))])


def make(c):
    torch.manual_seed(c["seed"])
    return Decoder(c)


def model_of(net, c):
    clean = stages_of(c)
    optimized = stages_of(c, c.get("fault"), c.get("layer"))
    return capsule.Model("padded_decoder", net, optimized, config=c, reference_stages=clean)


def factory(c):
    return model_of(make(c), c)


def batch(c, seed, n=4, ignore_pad=False, empty=(), prompt=0):
    """A right-padded batch of `n` counting samples of random lengths; the samples in `empty` are
    all padding. With `prompt` > 0, the first `prompt` tokens are a prompt (response_mask 0) and
    their labels -100."""
    g = torch.Generator().manual_seed(seed)
    t, v = c["seq"], c["vocab"]
    start = torch.randint(1, v, (n, 1), generator=g)
    stride = torch.randint(1, 4, (n, 1), generator=g)
    tokens = (start + stride * torch.arange(t + 1)) % (v - 1) + 1
    lengths = torch.randint(t // 4, t + 1, (n,), generator=g)
    for i in empty:
        lengths[i] = 0
    real = torch.arange(t + 1)[None, :] < lengths[:, None]
    tokens = torch.where(real, tokens, torch.full_like(tokens, PAD))
    input_ids, labels = tokens[:, :t].contiguous(), tokens[:, 1:].contiguous()
    attention = real[:, :t].long()
    loss_mask = real[:, 1:].long()  # a target: the next token is real
    labels = labels.masked_fill(loss_mask == 0, -100 if ignore_pad else PAD)
    out = {"input_ids": input_ids, "labels": labels, "attention_mask": attention,
           "loss_mask": loss_mask, "labels_shifted": True}
    if prompt > 0:
        response = torch.ones_like(input_ids)
        response[:, :prompt] = 0
        out["response_mask"] = response
    return out


def train(c, monitor, steps, capture_at=None, ignore_pad=False, empty_at=None, prompt=0,
          prompt_in_loss=False, data_seed=0, freeze=()):
    """AdamW steps of the decoder under `monitor` (attached here); a capture by hand at step
    `capture_at`. The parameters whose names start with one of `freeze` are frozen. Returns the
    net and the last step's report."""
    net = make(c)
    for name, p in net.named_parameters():
        if name.startswith(tuple(freeze)):
            p.requires_grad_(False)
    monitor.attach(model_of(net, c))
    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=3e-3)
    report = None
    for step in range(steps):
        b = batch(c, 1000 * data_seed + step, ignore_pad=ignore_pad,
                  empty=(1,) if step == empty_at else (), prompt=prompt)
        if prompt > 0 and not prompt_in_loss:
            b["labels"][:, :prompt] = -100
        opt.zero_grad()
        with monitor.step(step, batch=b) as s:
            loss = token_mean_loss(net.lm_head(net.norm(_body(net, b, c))), b)
            loss.backward()
            report = s.end(loss=loss, grad_norm=_grad_norm(net))
            if step == capture_at:
                report = s.capture_now("look at this step")
        if torch.isfinite(loss):
            opt.step()
    return net, report


def _body(net, b, c):
    x = net.embed(b["input_ids"])
    for i in range(c["layers"]):
        x = stages_of(c, c.get("fault"), c.get("layer"))[1 + i][1](net, x, b)
    return x


def _grad_norm(net):
    sq = sum(p.grad.double().pow(2).sum() for p in net.parameters() if p.grad is not None)
    return float(sq) ** 0.5
