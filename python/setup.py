"""pip install --no-build-isolation ./python: builds the extension with the project's CMake.

The extension (capsule._capsule) is the CMake target capsule_python_ext; this script configures
and builds it (LibTorch, protobuf, zstd, OpenSSL and pybind11 from Debian, as scripts/setup-deps.sh
installs them) and installs it with the pure-Python package. Needs no network.

Nothing is written into the source tree: the CMake build lives in CAPSULE_BUILD_DIR when it is set
(the project's build/ reuses what scripts/test.sh compiled), else in a cache folder kept between
installs ($XDG_CACHE_HOME or ~/.cache, then capsule/pip-build-pyX.Y-<checkout>), so a second install rebuilds
only what changed; setuptools' own build/ and egg-info go to a temporary folder. The build runs
CMAKE_BUILD_PARALLEL_LEVEL jobs when that is set (CMake's own setting), else one per CPU.
"""
import atexit
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def default_build_dir():
    # One per checkout and interpreter: a build directory belongs to one source tree.
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    tree = hashlib.sha256(ROOT.encode()).hexdigest()[:12]
    return os.path.join(cache, "capsule", f"pip-build-py{sys.version_info.major}."
                        f"{sys.version_info.minor}-{tree}")


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = os.path.abspath(os.environ.get("CAPSULE_BUILD_DIR") or default_build_dir())
        if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            os.makedirs(build_dir, exist_ok=True)
            print(f"capsule: configuring the engine's build in {build_dir}", flush=True)
            subprocess.check_call([
                "cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
                "-DCAPSULE_BUILD_TESTS=OFF", "-DCAPSULE_BUILD_BENCH=OFF",
                f"-DPython3_EXECUTABLE={sys.executable}"])
        command = ["cmake", "--build", build_dir, "--target", "capsule_python_ext"]
        if not os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL"):
            command += ["-j", str(os.cpu_count() or 1)]
        print(f"capsule: building the engine in {build_dir}", flush=True)
        subprocess.check_call(command)
        built = os.path.join(build_dir, "python", "capsule")
        names = [n for n in os.listdir(built) if n.startswith("_capsule") and n.endswith(".so")]
        if len(names) != 1:
            raise RuntimeError(f"capsule: expected one _capsule*.so in {built}, found {names}")
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(os.path.join(built, names[0]), target)


# setuptools writes build/ and capsule.egg-info beside this file unless told otherwise: both go to
# a temporary folder, so that installing leaves the checkout as it was.
SCRATCH = tempfile.mkdtemp(prefix="capsule-setup-")
atexit.register(shutil.rmtree, SCRATCH, ignore_errors=True)

setup(
    name="capsule",
    version="0.1.0",
    description="Failure capsules and deterministic replay for ML training (over capsule's C++ "
                "engine)",
    packages=["capsule"],
    ext_modules=[Extension("capsule._capsule", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.9",
    options={"build": {"build_base": os.path.join(SCRATCH, "build")},
             "egg_info": {"egg_base": SCRATCH}},
)
