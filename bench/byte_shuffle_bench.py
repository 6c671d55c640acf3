#!/usr/bin/python3
"""Does a byte-plane shuffle before zstd pay off on model weights?

A capsule's tensor bytes go into one zstd frame as they lie in memory, where each float's
compressible sign/exponent byte sits between near-random mantissa bytes. The shuffle (as in
HDF5/Blosc) writes a tensor of k-byte elements as all its byte-0s, then all byte-1s, ... so
that each byte plane compresses on its own.

Weights: the floating tensors of --checkpoint (a torch state dict), else a 2-layer byte-level
GPT (d_model 256) trained here for up to 200 Adam steps on Python's stdlib sources; and, for
contrast, that GPT at initialisation. Each set is cast to float32, bfloat16 and float16 and
compressed as one frame, plain or tensor by tensor shuffled, at zstd levels -1 (capsule's
default, --fast=1) and 3. Reports the ratio (original / compressed), one-thread compress and
decompress MB/s of original bytes (the shuffled ones include numpy's shuffle / unshuffle), the
shuffle's own MB/s, and checks that decompress + unshuffle gives back the original bytes.

    /usr/bin/python3 bench/byte_shuffle_bench.py [--checkpoint PATH] [--json]
"""
import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
import timeit

import numpy as np
import torch

LEVELS = (-1, 3)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def best_time(fn, reps=5):
    return min(timeit.repeat(fn, number=1, repeat=reps))


class CliZstd:
    """The zstd command line. Sizes and the bytes back come from a round trip through files;
    speeds from its in-process benchmark (-b), as process start-up and file I/O would swamp a
    few MB. --single-thread: in the calling thread, as the capsule writer compresses by default."""

    SPEEDS = re.compile(r"([\d.]+) MB/s,?\s+([\d.]+) MB/s")

    def __init__(self, exe, work):
        self.exe, self.work = exe, work

    def _run(self, *args):
        return subprocess.run([self.exe, "-q", "-f", "--single-thread", *args],
                              capture_output=True, text=True, check=True).stdout

    def roundtrip(self, data, level):
        """Returns (compressed, decompressed, compress seconds, decompress seconds)."""
        src, packed, back = (os.path.join(self.work, n) for n in ("src", "src.zst", "back"))
        with open(src, "wb") as f:
            f.write(data)
        flag = f"--fast={-level}" if level < 0 else f"-{level}"
        self._run(flag, src, "-o", packed)
        self._run("-d", packed, "-o", back)
        compress_mb_s, decompress_mb_s = self.SPEEDS.findall(self._run(flag, "-b", "-i1", src))[-1]
        with open(packed, "rb") as p, open(back, "rb") as b:
            mb = len(data) / 1e6  # zstd's MB, like ours, is 10^6 bytes
            return p.read(), b.read(), mb / float(compress_mb_s), mb / float(decompress_mb_s)


class LibZstd:
    """The zstandard module, in process."""

    def __init__(self, zstandard):
        self.zstd = zstandard

    def roundtrip(self, data, level):
        cctx = self.zstd.ZstdCompressor(level=level, write_checksum=True)
        dctx = self.zstd.ZstdDecompressor()
        packed = cctx.compress(data)
        return (packed, dctx.decompress(packed), best_time(lambda: cctx.compress(data)),
                best_time(lambda: dctx.decompress(packed)))


def make_codec(work):
    exe = shutil.which("zstd")
    if exe:
        return CliZstd(exe, work), "zstd CLI " + exe
    try:
        import zstandard
    except ImportError:
        print("byte_shuffle_bench: neither the zstd command nor the Python zstandard module is "
              "available; install one (apt-get install zstd)", file=sys.stderr)
        sys.exit(2)
    return LibZstd(zstandard), "zstandard " + zstandard.__version__


class TinyGpt(torch.nn.Module):
    def __init__(self, d_model=256, n_layers=2, context=64):
        super().__init__()
        self.tok = torch.nn.Embedding(256, d_model)
        self.pos = torch.nn.Parameter(0.02 * torch.randn(context, d_model))
        # Layers built one by one: nn.TransformerEncoder deep-copies one layer, and identical
        # layers at init would hand zstd long matches that no real initialisation has.
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(d_model, 4, 4 * d_model, dropout=0.0,
                                             batch_first=True, norm_first=True)
            for _ in range(n_layers))
        self.norm = torch.nn.LayerNorm(d_model)
        self.head = torch.nn.Linear(d_model, 256)

    def forward(self, x):
        t = x.shape[1]
        causal = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
        h = self.tok(x) + self.pos[:t]
        for block in self.blocks:
            h = block(h, src_mask=causal)
        return self.head(self.norm(h))


def train_tiny_gpt(steps=200, budget_s=50.0, batch=8, context=64):
    """Returns (initial state, trained state, note). Stops early past budget_s."""
    stdlib = pathlib.Path(os.__file__).parent
    text = b"".join(path.read_bytes() for path in sorted(stdlib.glob("*.py")))[:4 << 20]
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
    torch.manual_seed(0)
    model = TinyGpt(context=context)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    start, losses = time.perf_counter(), []
    for _ in range(steps):
        at = torch.randint(0, len(data) - context - 1, (batch,))
        window = torch.stack([data[i:i + context + 1] for i in at])
        logits = model(window[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), window[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if time.perf_counter() - start > budget_s:
            break
    note = f"tiny GPT trained {len(losses)} steps in {time.perf_counter() - start:.0f} s"
    if losses:
        note += f", loss {losses[0]:.2f} -> {losses[-1]:.2f}"
    return initial, model.state_dict(), note


def float_tensors(obj):
    """The floating tensors of a state dict, of one nested in a checkpoint dict, or of a model."""
    if isinstance(obj, torch.nn.Module):
        obj = obj.state_dict()
    if torch.is_tensor(obj):
        return [obj] if obj.is_floating_point() else []
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
    return [t for v in items for t in float_tensors(v)]


def as_bytes(tensor, dtype):
    t = tensor.detach().to(dtype).contiguous().reshape(-1)
    if dtype != torch.float32:  # numpy has no bfloat16; its bits are all we need
        t = t.view(torch.int16)
    return t.numpy().view(np.uint8)


def shuffle(planes, k):
    return [p.reshape(-1, k).T.copy() for p in planes]


def unshuffle(planes, k):
    return [p.reshape(k, -1).T.copy() for p in planes]


def measure(codec, tensors, dtype):
    k = torch.tensor([], dtype=dtype).element_size()
    plain = [as_bytes(t, dtype) for t in tensors]
    size = sum(p.size for p in plain)
    mb = size / 1e6
    t_shuffle = best_time(lambda: shuffle(plain, k))
    shuffled = shuffle(plain, k)
    t_unshuffle = best_time(lambda: unshuffle(shuffled, k))
    plain_blob = b"".join(p.tobytes() for p in plain)
    shuffled_blob = b"".join(s.tobytes() for s in shuffled)
    rows = []
    for level in LEVELS:
        row = {"dtype": str(dtype).replace("torch.", ""), "mb": mb, "level": level,
               "shuffle_mb_s": mb / t_shuffle, "unshuffle_mb_s": mb / t_unshuffle}
        for name, blob in (("plain", plain_blob), ("shuffled", shuffled_blob)):
            packed, back, t_c, t_d = codec.roundtrip(blob, level)
            if name == "shuffled":  # the round trip a reader would do: split, unshuffle, join
                sizes = np.cumsum([p.size for p in plain])[:-1]
                parts = np.split(np.frombuffer(back, np.uint8), sizes)
                back = b"".join(u.tobytes() for u in unshuffle(parts, k))
                t_c, t_d = t_c + t_shuffle, t_d + t_unshuffle
            row[name] = {"compressed_bytes": len(packed), "ratio": size / len(packed),
                         "compress_mb_s": mb / t_c, "decompress_mb_s": mb / t_d,
                         "round_trip_ok": back == plain_blob}
        rows.append(row)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", help="a torch state dict to measure instead of training")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = time.perf_counter()
    if args.checkpoint:  # the tiny GPT untrained still gives the contrast with init weights
        initial, _, _ = train_tiny_gpt(steps=0)
        state = torch.load(args.checkpoint, map_location="cpu")
        weight_sets = {"checkpoint": float_tensors(state), "init": float_tensors(initial)}
        note = f"checkpoint {args.checkpoint}; init = tiny GPT at step 0"
    else:
        initial, trained, note = train_tiny_gpt()
        weight_sets = {"trained": float_tensors(trained), "init": float_tensors(initial)}
    with tempfile.TemporaryDirectory() as work:
        codec, codec_name = make_codec(work)
        results = [dict(row, weights=name)
                   for name, tensors in weight_sets.items()
                   for dtype in DTYPES for row in measure(codec, tensors, dtype)]
    all_ok = all(r[n]["round_trip_ok"] for r in results for n in ("plain", "shuffled"))
    if args.json:
        print(json.dumps({"weights": note, "codec": codec_name, "round_trip_ok": all_ok,
                          "results": results}, indent=1))
    else:
        print(f"# {note}; {codec_name}; MB/s of original bytes, one thread; "
              "_sh: shuffled, its MB/s including the numpy shuffle / unshuffle")
        columns = ("weights", "dtype", "MB", "level", "ratio", "ratio_sh", "comp", "comp_sh",
                   "decomp", "decomp_sh", "shuffle", "unshuffle")
        print(" ".join(f"{c:>9}" for c in columns))
        for r in results:
            p, s = r["plain"], r["shuffled"]
            speeds = (p["compress_mb_s"], s["compress_mb_s"], p["decompress_mb_s"],
                      s["decompress_mb_s"], r["shuffle_mb_s"], r["unshuffle_mb_s"])
            cells = [r["weights"], r["dtype"], f"{r['mb']:.2f}", r["level"], f"{p['ratio']:.3f}",
                     f"{s['ratio']:.3f}"] + [f"{v:.0f}" for v in speeds]
            print(" ".join(f"{c:>9}" for c in cells))
        print(f"# round trip (decompress, unshuffle == original): {'ok' if all_ok else 'FAILED'}; "
              f"{time.perf_counter() - started:.0f} s in all")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
