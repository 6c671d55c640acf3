"""Writes the seed corpus of the checkpoint reader's fuzz target (tests/fuzz/checkpoint_fuzzer.h)
with Debian's python3-torch:

    /usr/bin/python3 tests/fuzz/make_checkpoint_corpus.py tests/fuzz/corpus/checkpoint

"*.pt" seeds are whole files, as torch.save and torch.jit.save write them (the TorchScript archive
without its .debug_pkl records, which hold source paths). "*.pkl" seeds are data.pkl alone: the
target reads them inside an archive whose storages data/0 .. data/7 are 128 bytes each, so every
storage they name is 128 bytes. "ok-*" must be read and "bad-*" refused (the regression driver
checks both). The output is deterministic.
"""
import io
import struct
import sys
import zipfile

import torch

out = sys.argv[1]


def arange(n, dtype=torch.float32):
    return torch.arange(n, dtype=torch.float64).to(dtype)


def save(name, obj, **kwargs):
    torch.save(obj, f"{out}/{name}", **kwargs)


def data_pkl(obj, **kwargs):
    buffer = io.BytesIO()
    torch.save(obj, buffer, **kwargs)
    z = zipfile.ZipFile(buffer)
    return z.read([n for n in z.namelist() if n.endswith("/data.pkl")][0])


def write(name, data):
    with open(f"{out}/{name}", "wb") as f:
        f.write(data)


class Inner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("running", arange(32))

    def forward(self, x):
        return x + self.running


class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(arange(32))
        self.inner = Inner()

    def forward(self, x):
        return self.inner(x) * self.weight


def script_archive():
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(Outer()), buffer)
    return zipfile.ZipFile(buffer)


def record(name, compression=zipfile.ZIP_STORED):  # a fixed date: the same bytes every run
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = compression
    return info


def without_debug(z):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as w:
        for info in z.infolist():
            if not info.filename.endswith(".debug_pkl"):
                w.writestr(record(info.filename), z.read(info.filename))
    return buffer.getvalue()


# Whole files.
model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.LayerNorm(2))
with torch.no_grad():
    model[0].weight.copy_(arange(6).reshape(2, 3))
    model[0].bias.copy_(arange(2))
save("ok-state-dict.pt", model.state_dict())
save("ok-one-entry.pt", {"w": arange(4)})
base = arange(12, torch.int64)
save("ok-views.pt", {"t": base.view(3, 4).t(), "slice": base[2:5], "whole": base,
                     "bf16": arange(3, torch.bfloat16), "p": torch.nn.Parameter(arange(2))})
write("ok-module-archive.pt", without_debug(script_archive()))
# The legacy format's head (magic number, protocol, system info); what follows names storages by
# object ids, which differ from run to run.
legacy = io.BytesIO()
torch.save({"w": arange(4)}, legacy, _use_new_zipfile_serialization=False)
write("bad-legacy.pt", legacy.getvalue()[:64])
with zipfile.ZipFile(f"{out}/bad-compressed.pt", "w") as z:
    z.writestr(record("archive/data.pkl", zipfile.ZIP_DEFLATED), data_pkl({"w": arange(32)}))
    z.writestr(record("archive/data/0", zipfile.ZIP_DEFLATED), bytes(128))

# data.pkl alone; every storage 128 bytes.
sized = torch.nn.Sequential(torch.nn.Linear(8, 4, bias=False), torch.nn.LayerNorm(32))
write("ok-state-dict.pkl", data_pkl(sized.state_dict()))
b16 = arange(16, torch.int64)
write("ok-views.pkl", data_pkl({"t": b16.view(4, 4).t(), "slice": b16[3:9],
                                "p": torch.nn.Parameter(arange(64, torch.bfloat16))}))
write("ok-protocol-4.pkl", data_pkl({"w": arange(32), "h": arange(64, torch.float16)},
                                    pickle_protocol=4))
write("ok-module.pkl", script_archive().read("archive/data.pkl"))


def unicode(s):
    return b"X" + struct.pack("<I", len(s)) + s.encode()


def storage(numel, key="0", kind="FloatStorage"):
    return (b"(" + unicode("storage") + f"ctorch\n{kind}\n".encode() + unicode(key) +
            unicode("cpu") + b"\x8a\x08" + struct.pack("<q", numel) + b"tQ")


def tensor(numel, size, stride=1, offset=0):
    return (b"ctorch._utils\n_rebuild_tensor_v2\n(" + storage(numel) + b"J" +
            struct.pack("<i", offset) + b"J" + struct.pack("<i", size) + b"\x85J" +
            struct.pack("<i", stride) + b"\x85\x89ccollections\nOrderedDict\n)RtR")


def state_dict(value):
    return b"\x80\x02}(" + unicode("w") + value + b"u."


write("ok-type-tag.pkl", b"\x80\x02ctorch.jit._pickle\nrestore_type_tag\n(" +
      state_dict(tensor(32, 32))[2:-1] + unicode("Dict[str, Tensor]") + b"tR.")
write("bad-os-system.pkl", b"\x80\x02cos\nsystem\n(" + unicode("true") + b"tR.")
write("bad-load-from-bytes.pkl", b"\x80\x02ctorch.storage\n_load_from_bytes\n(" +
      b"C\x01\x00tR.")
write("bad-setstate-tuple.pkl", b"\x80\x02c__torch__\nEvil\n)\x81(" + tensor(32, 32) +
      b"\x88tb.")
write("bad-marks.pkl", b"\x80\x02" + b"(" * 1001 + b".")
write("bad-memo.pkl", b"\x80\x02}r" + struct.pack("<I", 0x0FFFFFFF) + b".")
write("bad-oversized-view.pkl", state_dict(tensor(32, 1 << 30)))
write("bad-huge-storage.pkl", state_dict(tensor(1 << 34, 1)))
write("bad-expanded-view.pkl", state_dict(tensor(32, 1000, stride=0)))
write("bad-offset-past-end.pkl", state_dict(tensor(32, 2, offset=31)))
write("bad-pop.pkl", b"\x80\x02}0.")
write("bad-not-a-tensor.pkl", state_dict(b"K\x03"))
