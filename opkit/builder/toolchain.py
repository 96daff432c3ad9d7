"""The compiler, its flags and the versions that decide what a build produces."""
from __future__ import annotations

import dataclasses
import functools
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from typing import Dict, Tuple

from .. import __version__
from .._paths import templates_dir
from ..errors import BuildError
from ..target import Target, current


@dataclass(frozen=True)
class Toolchain:
    cc: Tuple[str, ...]
    family: str                  # gcc | clang | other
    version: str                 # the compiler's own first line of --version
    cflags: Tuple[str, ...]
    includes: Tuple[str, ...]
    ext_suffix: str
    cython_version: str
    numpy_version: str
    target: Target

    def key_material(self) -> Dict[str, object]:
        """Everything besides the source that changes the compiled module."""
        return {
            "opkit": __version__, "cython": self.cython_version, "numpy": self.numpy_version,
            "python": sys.version.split()[0], "ext_suffix": self.ext_suffix,
            "cc": list(self.cc), "cc_version": self.version, "cflags": list(self.cflags),
            "isa": self.target.isa, "machine": self.target.machine,
            "features": list(self.target.features),
        }

    def compile_command(self, c_file: str, so_file: str, report: str) -> list:
        cmd = list(self.cc) + list(self.cflags) + [f"-I{i}" for i in self.includes]
        if self.family == "gcc":
            cmd.append(f"-fopt-info-vec-all={report}")
        elif self.family == "clang":
            cmd += ["-Rpass=loop-vectorize", "-Rpass-missed=loop-vectorize"]
        return cmd + [c_file, "-o", so_file]

    def describe(self) -> str:
        return f"{self.version}; {' '.join(self.cflags)}"


def _compiler() -> Tuple[str, ...]:
    cc = os.environ.get("CC") or (sysconfig.get_config_var("CC") or "cc")
    parts = tuple(shlex.split(cc))
    if not parts or shutil.which(parts[0]) is None:
        for fallback in ("cc", "gcc", "clang"):
            if shutil.which(fallback):
                return (fallback,)
        raise BuildError("no C compiler found: install gcc or clang (Debian: apt install gcc), "
                         "or name one in the CC environment variable")
    return parts


@functools.lru_cache(maxsize=None)
def _compiler_version(cc: Tuple[str, ...]) -> str:
    try:
        out = subprocess.run(list(cc) + ["--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise BuildError(f"cannot run the C compiler {' '.join(cc)}: {exc}") from None
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else "unknown"


def _family(version: str) -> str:
    low = version.lower()
    if "clang" in low:
        return "clang"
    if "gcc" in low or "g++" in low or "free software foundation" in low:
        return "gcc"
    return "other"


def _flags(target: Target, family: str) -> Tuple[str, ...]:
    # -fno-math-errno / -fno-trapping-math change no result (nothing reads errno, no FP trap is
    # ever enabled) but let the compiler vectorize and if-convert freely; no -ffast-math: NaN,
    # inf and signed zeros keep their IEEE meaning
    flags = ["-O3", "-fPIC", "-shared", "-fno-math-errno", "-fno-trapping-math", "-fno-strict-aliasing",
             "-DNPY_NO_DEPRECATED_API=NPY_1_7_API_VERSION", "-Wno-unused-function",
             "-Wno-unreachable-code"]
    if os.environ.get("OPKIT_OPENMP", "1") != "0":
        flags.append("-fopenmp")
    if target.isa == "native":
        flags.append("-march=native")
    else:
        flags.append("-DOPKIT_NO_F16C")
    if sys.platform == "darwin":
        flags += ["-undefined", "dynamic_lookup"]
    extra = os.environ.get("OPKIT_CFLAGS")
    if extra:
        flags += shlex.split(extra)
    return tuple(flags)


@functools.lru_cache(maxsize=None)
def _versions() -> Tuple[str, str]:
    from importlib.metadata import PackageNotFoundError, version
    try:
        cython = version("Cython")
    except PackageNotFoundError:
        raise BuildError("Cython is not installed; run `pip install Cython`") from None
    import numpy
    return cython, numpy.__version__


_PROBE = """
void opk_probe(float *__restrict a, const float *__restrict b, long n)
{ for (long i = 0; i < n; i++) a[i] = b[i] * 2.0f + 1.0f; }
"""


@functools.lru_cache(maxsize=None)
def probe_vector_bytes(cc: Tuple[str, ...], family: str, flags: Tuple[str, ...], guess: int) -> int:
    """The vector width the compiler really uses for a float loop with these flags (GCC says it
    in its vectorization report); the CPU-feature guess when the compiler does not report."""
    if family != "gcc":
        return guess
    import re
    import tempfile
    keep = [f for f in flags if f.startswith(("-m", "-O", "-f")) and f != "-fopenmp"]
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as fh:
            fh.write(_PROBE)
        try:
            r = subprocess.run(list(cc) + keep + ["-c", src, "-o", os.path.join(tmp, "probe.o"),
                                                   "-fopt-info-vec-optimized"],
                               capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.SubprocessError):
            return guess
    widths = [int(w) for w in re.findall(r"using (\d+) byte vectors", r.stderr)]
    return max(widths) if widths else guess


def toolchain(isa: str = "") -> Toolchain:
    """The toolchain of this process (CC, OPKIT_ISA, OPKIT_CFLAGS, OPKIT_OPENMP are read here)."""
    target = current(isa)
    cc = _compiler()
    version = _compiler_version(cc)
    family = _family(version)
    import numpy
    includes = (sysconfig.get_paths()["include"], numpy.get_include(), str(templates_dir()))
    cython, np_version = _versions()
    flags = _flags(target, family)
    width = probe_vector_bytes(cc, family, flags, target.vector_bytes)
    if width != target.vector_bytes:
        target = dataclasses.replace(target, vector_bytes=width)
    return Toolchain(cc, family, version, flags, includes,
                     sysconfig.get_config_var("EXT_SUFFIX") or ".so", cython, np_version, target)
