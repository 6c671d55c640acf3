"""Writes the checkpoints CheckpointTest reads, with Debian's python3-torch (the release
libtorch-dev ships), at test time: python3 make_checkpoints.py OUT_DIR CANARY_PATH.

Every value is a function of arange, so the C++ test recomputes what it should read. CANARY_PATH
is a file that the TorchScript archives' own code would create if anything ran it.
"""
import struct
import sys
import zipfile
import torch

out, canary = sys.argv[1], sys.argv[2]


def arange(n, dtype=torch.float32):
    return torch.arange(n, dtype=torch.float64).to(dtype)


# model.state_dict() itself: an OrderedDict carrying _metadata, as torch.save writes it.
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.LayerNorm(2))
with torch.no_grad():
    model[0].weight.copy_(arange(6).reshape(2, 3))
    model[0].bias.copy_(arange(2))
torch.save(model.state_dict(), f"{out}/state_dict.pt")

# One entry: SETITEM, not SETITEMS.
torch.save({"w": arange(4)}, f"{out}/one_entry.pt")

# Dtypes, each from its own storage.
torch.save({
    "bf16": arange(5, torch.bfloat16),
    "fp16": arange(5, torch.float16),
    "i64": arange(5, torch.int64),
    "f64": arange(5, torch.float64),
    "bool": arange(5) > 2,
}, f"{out}/dtypes.pt")

# Views of one storage: a transpose (strides 1, 4), a slice at offset 2, and the whole.
base = arange(12, torch.int64)
torch.save({"t": base.view(3, 4).t(), "slice": base[2:5], "whole": base}, f"{out}/views.pt")

# A Parameter (torch._utils._rebuild_parameter), requiring grad.
torch.save({"p": torch.nn.Parameter(arange(3))}, f"{out}/parameter.pt")


# A TorchScript module archive whose state is its attributes: read as data.
class Inner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(arange(4).reshape(2, 2))

    def forward(self, x):
        return x @ self.weight


class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Inner()
        self.register_buffer("scale", arange(2))
        self.steps = 3

    def forward(self, x):
        return self.inner(x) * self.scale


torch.jit.script(Outer()).save(f"{out}/module_archive.pt")


# Archives whose own code writes a file or never returns when torch.jit.load restores them.
# TorchScript compiles from source and cannot close over a Python string, so the canary's path is
# written into the source of a module imported from OUT_DIR.
HOSTILE = """
from typing import Dict, Tuple
import torch


class WritesAFile(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.arange(3.0))

    def forward(self, x):
        return x * self.w

    @torch.jit.export
    def __getstate__(self) -> Tuple[torch.Tensor, bool]:
        return (self.w, self.training)

    @torch.jit.export
    def __setstate__(self, state: Tuple[torch.Tensor, bool]) -> None:
        f = torch.from_file(CANARY, shared=True, size=16)
        self.w = state[0] + f[:3] * 0
        self.training = state[1]


class NeverReturns(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.arange(3.0))

    def forward(self, x):
        return x * self.w

    @torch.jit.export
    def __getstate__(self) -> Dict[str, torch.Tensor]:
        return {"w": self.w}

    @torch.jit.export
    def __setstate__(self, state: Dict[str, torch.Tensor]) -> None:
        n = 0
        while n >= 0:
            n = n + 1 - 1
        self.w = state["w"]
"""
with open(f"{out}/hostile_modules.py", "w") as f:
    f.write(HOSTILE.replace("CANARY", repr(canary)))
sys.path.insert(0, out)
import hostile_modules  # noqa: E402

torch.jit.script(hostile_modules.WritesAFile()).save(f"{out}/writes_a_file.pt")
torch.jit.script(hostile_modules.NeverReturns()).save(f"{out}/never_returns.pt")


# Hostile archives, each a hand-written pickle in the zip container (no torch needed to make
# them). LibTorch's unpickler crashed or took gigabytes on each.
def hostile(name, pickle, records=()):
    with zipfile.ZipFile(f"{out}/{name}.pt", "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickle)
        for record, data in records:
            z.writestr("archive/" + record, data)
        z.writestr("archive/version", b"3\n")


def unicode(s):
    return b"X" + struct.pack("<I", len(s)) + s.encode()


def storage(numel):  # ('storage', torch.FloatStorage, '0', 'cpu', numel), LONG1 of 8 bytes
    return (b"(" + unicode("storage") + b"ctorch\nFloatStorage\n" + unicode("0") +
            unicode("cpu") + b"\x8a\x08" + struct.pack("<q", numel) + b"tQ")


def tensor(numel, size):  # _rebuild_tensor_v2(storage, 0, (size,), (1,), False, OrderedDict())
    return (b"ctorch._utils\n_rebuild_tensor_v2\n(" + storage(numel) + b"K\x00J" +
            struct.pack("<i", size) + b"\x85K\x01\x85\x89ccollections\nOrderedDict\n)RtR")


N = 1000000
hostile("marks", b"\x80\x02" + b"(" * N + b".")
hostile("nested_lists", b"\x80\x02]" + b"(]" * N + b"e" * N + b".")
hostile("memo", b"\x80\x02}r" + struct.pack("<I", 0x0FFFFFFF) + b".")
hostile("oversized_view", b"\x80\x02}(" + unicode("w") + tensor(1, 1 << 30) + b"u.",
        [("data/0", b"\0" * 4)])
hostile("huge_storage", b"\x80\x02}(" + unicode("w") + tensor(1 << 34, 1) + b"u.",
        [("data/0", b"\0" * 4)])
