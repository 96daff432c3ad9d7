"""The machine kernels are compiled for: instruction set, vector width, CPU features."""
from __future__ import annotations

import functools
import platform
from dataclasses import dataclass
from typing import Tuple

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


@functools.lru_cache(maxsize=None)
def cpu_features() -> Tuple[str, ...]:
    flags: set = set()
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith(("flags", "Features")):
                    flags.update(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    return tuple(f for f in _RELEVANT if f in flags)


def current(isa: str = "") -> Target:
    """The target for `isa`, or for the `isa` setting (OPKIT_ISA; native by default)."""
    if not isa:
        isa = setting("isa")
    if isa not in ISAS:
        raise ValueError(f"isa must be one of {', '.join(ISAS)}, got {isa!r}")
    machine = platform.machine().lower()
    if isa == "portable":
        base = ("sse2",) if machine in ("x86_64", "amd64") else ()
        return Target(isa, machine, base, 16)
    feats = cpu_features()
    width = 64 if "avx512f" in feats else 32 if "avx2" in feats or "avx" in feats else 16
    return Target(isa, machine, feats, width)
