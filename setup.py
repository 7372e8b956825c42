"""Build of torch-nccl-core: the C++ extension torch_nccl_core._C over NCCL, and beside it
torch_nccl_core._testing, the test doubles the CPU tests drive it with.

NCCL is taken from the nvidia-nccl-cu13 package that torch itself loads, unless
NCCL_HOME, or NCCL_INCLUDE_DIR and NCCL_LIB_DIR, point elsewhere.
"""

import glob
import os
import re
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path

from setuptools import find_packages, setup

# torch derives CUDA_HOME from the nvcc on PATH; a wrapper script there (as on
# the project's build machines) would point it at the wrong prefix.
if "CUDA_HOME" not in os.environ and os.path.exists("/usr/local/cuda/include/cuda_runtime_api.h"):
    os.environ["CUDA_HOME"] = "/usr/local/cuda"


def use_shared_libstdcxx_compiler() -> None:
    """Build with a C++ compiler that links libstdc++ dynamically.

    A compiler that only has the static libstdc++ (as /opt/gcc on the project's GPU
    image) puts a private copy of it in the extension, and that copy crashes when
    streaming integers into error messages. Fall back to the system g++ then.
    """
    cxx = os.environ.get("CXX", "c++")
    found = subprocess.run(
        [cxx, "-print-file-name=libstdc++.so"], capture_output=True, text=True, check=False
    ).stdout.strip()
    if os.path.isabs(found) or not shutil.which("/usr/bin/g++"):
        return
    print(f"torch-nccl-core: {cxx} has no shared libstdc++; building with /usr/bin/g++")
    os.environ["CXX"] = "/usr/bin/g++"


use_shared_libstdcxx_compiler()

from torch.utils.cpp_extension import BuildExtension, CUDAExtension  # noqa: E402

ROOT = Path(__file__).parent


def nccl_dirs() -> tuple[str, str]:
    home = os.environ.get("NCCL_HOME")
    include = os.environ.get("NCCL_INCLUDE_DIR") or (home and os.path.join(home, "include"))
    lib = os.environ.get("NCCL_LIB_DIR") or (home and os.path.join(home, "lib"))
    if not (include and lib):
        import nvidia.nccl

        package = Path(next(iter(nvidia.nccl.__path__)))
        include = include or str(package / "include")
        lib = lib or str(package / "lib")
    if not os.path.exists(os.path.join(include, "nccl.h")):
        raise RuntimeError(f"nccl.h not found in {include}; set NCCL_HOME or NCCL_INCLUDE_DIR")
    return include, lib


def version() -> str:
    text = (ROOT / "torch_nccl_core" / "_version.py").read_text()
    return re.search(r'__version__ = "([^"]+)"', text).group(1)


class BuildExtensions(BuildExtension):
    """_testing after _C, linked to it: the test doubles drive _C's objects (one copy of its
    state in the process), found beside it at run time."""

    def build_extension(self, ext):
        if ext.name == TESTING:
            built = Path(self.get_ext_fullpath(PRODUCT))
            ext.library_dirs.append(str(built.parent))
            ext.extra_link_args += [f"-l:{built.name}", "-Wl,-rpath,$ORIGIN"]
        super().build_extension(ext)


def by_folder(name: str, sources: list[str]) -> list[str]:
    """The C++ files of each folder compiled as one (a unity build): torch's headers, most of a
    file's compile time, are then compiled once per folder, not once per file. So names in a
    file's anonymous namespace must differ from those of the other files in its folder.
    TORCH_NCCL_CORE_UNITY=0 compiles a file at a time, for quick rebuilds while editing."""
    if os.environ.get("TORCH_NCCL_CORE_UNITY") == "0":
        return sources
    folders = defaultdict(list)
    for source in sources:
        if source.endswith(".cpp"):
            folders[os.path.dirname(source)].append(source)
    combined = [source for source in sources if not source.endswith(".cpp")]
    for folder, files in folders.items():
        path = Path("build", "unity", name, folder.replace("/", "_") + ".cpp")
        text = "".join(f'#include "{(ROOT / file).resolve()}"\n' for file in files)
        # Rewritten only when it changes: ninja rebuilds what an included file's edit touches.
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        combined.append(str(path))
    return combined


def extension(name: str, sources: list[str], depends: list[str] = ()) -> CUDAExtension:
    return CUDAExtension(
        name=name,
        sources=by_folder(name, sources),
        # The files a unity file includes: setuptools rebuilds when one is newer.
        depends=[*depends, *sources],
        include_dirs=[str(ROOT / "csrc"), nccl_include],
        library_dirs=[nccl_lib],
        # The exact soname torch loads, so both share one NCCL instance.
        libraries=[":libnccl.so.2"],
        # Our code is C++17; torch picks the -std flag its headers need. No debug info unless
        # asked: Python's flags carry -g, which for torch's headers makes most of the build's
        # time and of _C's size.
        extra_compile_args={"cxx": ["-O2", DEBUG_INFO], "nvcc": ["-O2"]},
    )


PRODUCT, TESTING = "torch_nccl_core._C", "torch_nccl_core._testing"
# TORCH_NCCL_CORE_TESTING=1: build the test doubles too (the CPU tests, benchmarks' --noop-nccl);
# an install without them compiles 15% less.
BUILDS_TESTING = os.environ.get("TORCH_NCCL_CORE_TESTING") == "1"
# TORCH_NCCL_CORE_DEBUG_INFO=1: build with debug info (-g), for a debugger or sanitizer.
DEBUG_INFO = "-g" if os.environ.get("TORCH_NCCL_CORE_DEBUG_INFO") == "1" else "-g0"
nccl_include, nccl_lib = nccl_dirs()
# The test doubles (csrc/testing) are an extension of their own, never part of _C.
sources = sorted(
    glob.glob("csrc/**/*.cpp", recursive=True) + glob.glob("csrc/**/*.cu", recursive=True)
)
testing = [s for s in sources if s.startswith("csrc/testing/")]
product = [s for s in sources if s not in testing]
# Both compile the headers (_testing, _C's class layouts and inline code): rebuilt when one
# changes, which setuptools' own up-to-date check (sources only) would miss.
headers = sorted(glob.glob("csrc/**/*.h", recursive=True))

setup(
    name="torch-nccl-core",
    version=version(),
    description="A PyTorch distributed backend with the newest NCCL features",
    packages=find_packages(include=["torch_nccl_core", "torch_nccl_core.*"]),
    package_data={"torch_nccl_core": ["py.typed", "*.pyi"]},
    python_requires=">=3.10",
    ext_modules=[extension(PRODUCT, product, depends=headers)]
    + ([extension(TESTING, testing, depends=headers)] if BUILDS_TESTING else []),
    cmdclass={"build_ext": BuildExtensions},
    entry_points={
        "torch.distributed.backends": ["nccl_core = torch_nccl_core._registration:register"]
    },
)
