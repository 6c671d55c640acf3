"""pip install --no-build-isolation ./python: builds the extension with the project's CMake.

The extension (capsule._capsule) is the CMake target capsule_python_ext; this script configures
and builds it (LibTorch, protobuf, zstd, OpenSSL and pybind11 from Debian, as scripts/setup-deps.sh
installs them) and installs it with the pure-Python package. CAPSULE_BUILD_DIR names an existing
build directory to build in (the project's build/ reuses what scripts/test.sh compiled); without
it a fresh one is configured under the wheel's build folder. Needs no network.
"""
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = os.environ.get("CAPSULE_BUILD_DIR")
        if not build_dir:
            build_dir = os.path.abspath(os.path.join(self.build_temp, "cmake"))
            subprocess.check_call([
                "cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
                "-DCAPSULE_BUILD_TESTS=OFF", "-DCAPSULE_BUILD_BENCH=OFF",
                f"-DPython3_EXECUTABLE={sys.executable}"])
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "capsule_python_ext",
                               "-j", str(os.cpu_count() or 1)])
        built = os.path.join(build_dir, "python", "capsule")
        names = [n for n in os.listdir(built) if n.startswith("_capsule") and n.endswith(".so")]
        if len(names) != 1:
            raise RuntimeError(f"capsule: expected one _capsule*.so in {built}, found {names}")
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(os.path.join(built, names[0]), target)


setup(
    name="capsule",
    version="0.1.0",
    description="Failure capsules and deterministic replay for ML training (over capsule's C++ "
                "engine)",
    packages=["capsule"],
    ext_modules=[Extension("capsule._capsule", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.9",
)
