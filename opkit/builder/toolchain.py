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

from .._version import __version__
from .._paths import templates_dir
from ..errors import BuildError
from ..target import Target, current
from .cache import recorded_vector_bytes


@dataclass(frozen=True)
class Toolchain:
    cc: Tuple[str, ...]          # () when there is no compiler to run
    family: str                  # gcc | clang | other | none
    version: str                 # the compiler's own first line of --version
    cflags: Tuple[str, ...]
    includes: Tuple[str, ...]
    ext_suffix: str
    cython_version: str          # "" when Cython is not installed
    numpy_version: str
    target: Target
    missing: str = ""            # why nothing can be built here ("" when it can)

    @property
    def available(self) -> bool:
        """Whether this toolchain can build; without it only cached modules can be used."""
        return not self.missing

    def require(self) -> None:
        if self.missing:
            raise BuildError(self.missing)

    def content_material(self) -> Dict[str, object]:
        """What changes the module whatever compiler builds it: a module built for the same
        content by another compiler is found with this when there is no compiler to run."""
        return {
            "opkit": __version__, "cython": self.cython_version, "numpy": self.numpy_version,
            "python": sys.version.split()[0], "ext_suffix": self.ext_suffix,
            "cflags": list(self.cflags), "isa": self.target.isa, "machine": self.target.machine,
            "features": list(self.target.features),
        }

    def ship_material(self) -> Dict[str, object]:
        """What a module built ahead of time (in a wheel) must share with this process: the
        content material less Cython's and NumPy's versions and Python's micro version."""
        from .cache import loose
        return loose(self.content_material())

    def key_material(self) -> Dict[str, object]:
        """Everything besides the source that changes the compiled module."""
        return dict(self.content_material(), cc=list(self.cc), cc_version=self.version)

    def compile_command(self, c_file: str, so_file: str, report: str, objects=()) -> list:
        """The module `so_file` from `c_file`, linked with `objects` (the kernel runtime)."""
        self.require()
        cmd = list(self.cc) + list(self.cflags) + [f"-I{i}" for i in self.includes]
        if self.family == "gcc":
            # two kernels of a module can be the same code (an operator's variants that share
            # a pass): kept apart, each has its loop and the vectorization report `opkit show`
            # reads. (A compiler-specific flag, so not in cflags: those name what a module
            # holds whichever compiler built it, and a shipped module is found by them.)
            cmd += [f"-fopt-info-vec-all={report}", "-fno-ipa-icf"]
        elif self.family == "clang":
            cmd += ["-Rpass=loop-vectorize", "-Rpass-missed=loop-vectorize"]
        return cmd + [c_file, *[str(o) for o in objects], "-o", so_file]

    def object_command(self, c_file: str, o_file: str) -> list:
        """An object file for the modules to link: the same flags, compiled only."""
        self.require()
        flags = [f for f in self.cflags if f != "-shared"]
        return list(self.cc) + flags + [f"-I{i}" for i in self.includes] + ["-c", c_file, "-o", o_file]

    def describe(self) -> str:
        return f"{self.version or 'no compiler'}; {' '.join(self.cflags)}"


_NO_CC = ("no C compiler found: install gcc or clang (Debian: apt install gcc) or name one in "
          "the CC environment variable")


def _compiler() -> Tuple[Tuple[str, ...], str]:
    """The C compiler command, or () and why there is none. CC, when set, is the compiler."""
    env = os.environ.get("CC", "").strip()
    if env:
        try:
            parts = tuple(shlex.split(env))
        except ValueError as exc:
            return (), f"CC={env} cannot be read as a command ({exc}); fix or unset CC"
        if shutil.which(parts[0]) is None:
            return (), (f"CC={env}: {parts[0]} is not an executable program (not found on PATH); "
                        "set CC to an installed C compiler or unset it")
        return parts, ""
    conf = shlex.split(sysconfig.get_config_var("CC") or "")
    if conf and shutil.which(conf[0]):
        return tuple(conf), ""
    for fallback in ("cc", "gcc", "clang"):
        if shutil.which(fallback):
            return (fallback,), ""
    return (), _NO_CC


@functools.lru_cache(maxsize=None)
def _compiler_version(cc: Tuple[str, ...]) -> Tuple[str, str]:
    """The first line of `cc --version` ("unknown" if it says nothing), or "" and why it cannot run."""
    try:
        out = subprocess.run(list(cc) + ["--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return "", f"cannot run the C compiler {' '.join(cc)}: {exc}; install one or set CC"
    text = (out.stdout or out.stderr).strip()
    return (text.splitlines()[0] if text else "unknown"), ""


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
    # inf and signed zeros keep their IEEE meaning. -ffp-contract=off: a * x + b rounds twice, as
    # in NumPy and on the portable target, instead of once in a fused multiply-add where the CPU
    # has one (hardsigmoid's kink at -3 otherwise moves by 2.8e-17)
    flags = ["-O3", "-fPIC", "-shared", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math",
             "-fno-strict-aliasing",
             "-DNPY_NO_DEPRECATED_API=NPY_1_7_API_VERSION", "-Wno-unused-function",
             "-Wno-unreachable-code"]
    if os.environ.get("OPKIT_OPENMP", "1") != "0":
        flags.append("-fopenmp")
    if target.isa == "native":
        flags.append("-march=native")
    elif target.isa == "portable":
        flags.append("-DOPKIT_NO_F16C")
    else:  # an x86-64 level (x86-64-v3): exactly its features, whatever this CPU has
        flags.append(f"-march={target.isa}")
    if sys.platform == "darwin":
        flags += ["-undefined", "dynamic_lookup"]
    extra = os.environ.get("OPKIT_CFLAGS")
    if extra:
        flags += shlex.split(extra)
    return tuple(flags)


@functools.lru_cache(maxsize=None)
def _versions() -> Tuple[str, str]:
    """Cython's version ("" when it is not installed: cached modules still load) and NumPy's."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        cython = version("Cython")
    except PackageNotFoundError:
        cython = ""
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
    """The toolchain of this process (CC, OPKIT_ISA, OPKIT_CFLAGS, OPKIT_OPENMP are read here).

    Never raises for a missing compiler or Cython: operators are constructed (and cached
    modules loaded) without them; `missing` says why a build cannot run."""
    target = current(isa)
    cc, missing = _compiler()
    version = ""
    if cc:
        version, missing = _compiler_version(cc)
        cc = cc if version else ()
    family = _family(version) if cc else "none"
    import numpy
    includes = (sysconfig.get_paths()["include"], numpy.get_include(), str(templates_dir()))
    cython, np_version = _versions()
    if not cython and not missing:
        missing = "Cython is not installed; run `pip install Cython`"
    flags = _flags(target, family)
    tc = Toolchain(cc, family, version, flags, includes,
                   sysconfig.get_config_var("EXT_SUFFIX") or ".so", cython, np_version, target, missing)
    # the vector width the compiler really uses (it annotates the generated source): asked of
    # the compiler, or, without one, taken from what the cache's modules were built with
    if cc:
        width = probe_vector_bytes(cc, family, flags, target.vector_bytes)
    else:
        width = recorded_vector_bytes(tc.content_material()) or target.vector_bytes
    if width != target.vector_bytes:
        tc = dataclasses.replace(tc, target=dataclasses.replace(target, vector_bytes=width))
    return tc
