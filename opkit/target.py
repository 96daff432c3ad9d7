"""The machine kernels are compiled for: instruction set, vector width, CPU features."""
from __future__ import annotations

import functools
import platform
from dataclasses import dataclass
from typing import Dict, Tuple, TypedDict

from .config import ISAS
from .config import get as setting

# CPU features that change generated code; only these enter the cache key.
_RELEVANT = ("sse2", "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw",
             "avx512dq", "avx512vl", "avx512_fp16", "asimd", "fphp", "asimdhp")


@dataclass(frozen=True)
class Target:
    isa: str                      # native: every feature of this CPU; portable: baseline only
    machine: str                  # x86_64, aarch64 ...
    features: Tuple[str, ...]     # the relevant CPU features compiled for
    vector_bytes: int             # widest vector the compiler will use

    @property
    def f16_hardware(self) -> bool:
        """float16 <-> float32 conversion in hardware (F16C, AVX-512, or ARM fp16)."""
        return any(f in self.features for f in ("f16c", "avx512f", "fphp", "asimd"))

    def describe(self) -> str:
        f16 = "hardware" if self.f16_hardware else "portable C"
        return f"{self.machine} {self.isa} ({', '.join(self.features) or 'baseline'}); " \
               f"{self.vector_bytes}-byte vectors; float16 conversion: {f16}"


class Level(TypedDict):
    features: Tuple[str, ...]     # the features that change generated code
    flags: Tuple[str, ...]        # the CPU flags, as /proc/cpuinfo names them, a CPU needs
    vector_bytes: int


# The x86-64 micro-architecture levels that gcc and clang name with -march: what a module built
# for one may use (the features that change generated code) and the CPU flags (as
# /proc/cpuinfo names them) a CPU needs to run it.
LEVELS: Dict[str, Level] = {
    "x86-64-v3": {
        "features": ("sse2", "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c"),
        "flags": ("sse2", "cx16", "lahf_lm", "popcnt", "pni", "ssse3", "sse4_1", "sse4_2", "avx",
                  "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"),
        "vector_bytes": 32,
    },
}


@functools.lru_cache(maxsize=None)
def cpu_flags() -> Tuple[str, ...]:
    """Every CPU flag /proc/cpuinfo lists (empty where it cannot be read)."""
    flags: set = set()
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith(("flags", "Features")):
                    flags.update(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    return tuple(sorted(flags))


def cpu_features() -> Tuple[str, ...]:
    flags = set(cpu_flags())
    return tuple(f for f in _RELEVANT if f in flags)


def runs_here(isa: str, flags: Tuple[str, ...] = ()) -> bool:
    """Whether this CPU runs a module built for `isa` (for native: on a CPU with `flags`)."""
    return not missing_flags(isa, flags)


def missing_flags(isa: str, flags: Tuple[str, ...] = ()) -> Tuple[str, ...]:
    """What a module built for `isa` (for native: on a CPU with `flags`) needs that this CPU
    lacks: its CPU flags, or the x86-64 architecture itself."""
    if platform.machine().lower() not in ("x86_64", "amd64") and isa in LEVELS:
        return ("x86_64",)
    have = set(cpu_flags())
    need = LEVELS[isa]["flags"] if isa in LEVELS else flags if isa == "native" else ()
    return tuple(f for f in need if f not in have)


def current(isa: str = "") -> Target:
    """The target for `isa`, or for the `isa` setting (OPKIT_ISA; native by default)."""
    if not isa:
        isa = setting("isa")
    if isa not in ISAS:
        raise ValueError(f"isa must be one of {', '.join(ISAS)}, got {isa!r}")
    machine = platform.machine().lower()
    if isa in LEVELS:
        if machine not in ("x86_64", "amd64"):
            raise ValueError(f"isa {isa!r} is an x86-64 level; this machine is {machine}")
        level = LEVELS[isa]
        return Target(isa, machine, level["features"], level["vector_bytes"])
    if isa == "portable":
        base = ("sse2",) if machine in ("x86_64", "amd64") else ()
        return Target(isa, machine, base, 16)
    feats = cpu_features()
    width = 64 if "avx512f" in feats else 32 if "avx2" in feats or "avx" in feats else 16
    return Target(isa, machine, feats, width)


def fallback_isas(isa: str) -> Tuple[str, ...]:
    """What a process without a compiler may load instead of a module for `isa`: for native,
    the ISA levels this CPU runs, best first, then portable."""
    if isa != "native":
        return ()
    return tuple(level for level in LEVELS if runs_here(level)) + ("portable",)
