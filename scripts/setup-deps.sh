#!/usr/bin/env bash
# Installs every Debian (bookworm) package capsule needs to build, test, fuzz and benchmark.
# Idempotent: a no-op when everything is present; runs `apt-get update` at most once. Waits for the
# dpkg lock when another apt-get holds it.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libprotobuf-dev protobuf-compiler          # the capsule schema; protoc is also the stock decoder
  libzstd-dev zstd                           # payload codec; zstd(1) for the stock-tools interop test
  libssl-dev openssl                         # Ed25519 + SHA-256; openssl(1) for the interop test
  libcli11-dev                               # the command line
  libgtest-dev libgmock-dev libbenchmark-dev # tests and bench/
  libtorch-dev                               # capture/ and replay/ (LibTorch 1.13, CPU)
  libopenblas0-pthread                       # makes LibTorch's BLAS fast (the reference BLAS is ~6x slower)
  clang-14 libclang-rt-14-dev                # libFuzzer, ASan, UBSan
  coreutils                                  # od, dd, head: the stock-tools interop test
  chromium                                   # headless render of the HTML report (the test skips without it)
  clang-format                               # scripts/ci-format.sh (clang-format 14)
  go-md2man                                  # the man page capsule(1) from cli/capsule.md
  python3-torch python3-numpy                # PyTorch 1.13 (CPU, the same release as libtorch-dev), NumPy
  python3-torchvision                        # resnet18 and ViT for the Python tests on outside models
  pybind11-dev python3-pytest                # C++ bindings for Python, and pytest
  python3-pip python3-setuptools             # pip install --no-build-isolation ./python
  libgloo-dev                                # Gloo: CPU collectives for multi-process runs
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "setup-deps: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
lock=(-o DPkg::Lock::Timeout=600)
# apt's progress goes to a log (printed only when something fails), so the demo's output stays
# the demo's.
log=$(mktemp /tmp/capsule-setup-deps.XXXXXX.log)
if ! { $sudo apt-get "${lock[@]}" update -qq &&
  $sudo apt-get "${lock[@]}" install -y -qq --no-install-recommends "${missing[@]}"; } > "$log" 2>&1; then
  cat "$log" >&2
  echo "setup-deps: apt-get failed (log above, kept in $log)" >&2
  exit 1
fi
rm -f "$log"
echo "setup-deps: installed ${#missing[@]} packages"
