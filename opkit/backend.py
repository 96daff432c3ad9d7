"""The GEMM that fused convolutions and matmuls run on, picked when a module is rendered.

Two backends, chosen by measurement (docs/fusion.md has the table):
- `opkit` (the default): register-tiled micro-kernels that opkit generates for the target's
  vector registers (opkit/codegen/gemm.py), reading each block's input rows directly (no
  unfolded matrix). On an AMD EPYC (Zen 4) they ran the 3x3 convolution's GEMM at 94% of the
  FMA peak, built for AVX-512 and for AVX2 alike, where SciPy's OpenBLAS reached 58-66%; they
  need nothing installed.
- `blas`: SciPy's BLAS (`scipy.linalg.cython_blas`, OpenBLAS in SciPy's wheels), its sgemm/dgemm
  called without the GIL on each block's unfolded matrix. OPKIT_GEMM=blas picks it.
OPKIT_GEMM=none (or OPKIT_BLAS=none) makes the fused steps run their parts one after another
(the convolution in NumPy, then the epilogue kernel): the same results, more passes over memory.
The backend's name and version are part of the generated source, and so of the cache key.
"""
from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass
from typing import Optional, Tuple

from ._version import __version__

GEMMS = ("opkit", "blas", "none")
DEFAULT_GEMM = "opkit"   # measured faster in AVX-512 and AVX2 builds (docs/fusion.md)


@dataclass(frozen=True)
class Gemm:
    name: str           # opkit (generated micro-kernels) or blas (SciPy's)
    version: str

    def describe(self, vector_bytes: int = 0) -> str:
        if self.name == "blas":
            return f"SciPy {self.version} BLAS (scipy.linalg.cython_blas sgemm/dgemm)"
        from .codegen.gemm import describe
        return describe(vector_bytes) if vector_bytes else f"opkit {self.version} micro-kernels"


@functools.lru_cache(maxsize=None)
def _scipy() -> Optional[Gemm]:
    try:
        import scipy
        import scipy.linalg.cython_blas  # noqa: F401  (the module the generated code cimports)
    except ImportError:
        return None
    return Gemm("blas", scipy.__version__)


def requested() -> str:
    """OPKIT_GEMM (opkit, blas or none; OPKIT_BLAS=none is none); the default when unset.
    ValueError for anything else."""
    if os.environ.get("OPKIT_BLAS", "").strip().lower() in ("none", "off", "0"):
        return "none"
    want = os.environ.get("OPKIT_GEMM", "").strip().lower() or DEFAULT_GEMM
    if want not in GEMMS:
        raise ValueError(f"OPKIT_GEMM must be one of {', '.join(GEMMS)}, not {want!r}")
    return want


def blas_disabled() -> bool:
    """Fused steps run unfused: OPKIT_GEMM=none (or OPKIT_BLAS=none)."""
    return requested() == "none"


def gemm() -> Optional[Gemm]:
    """The GEMM backend of this process, or None: fused steps run their parts one after another
    (OPKIT_GEMM=none, or OPKIT_GEMM=blas without SciPy)."""
    want = requested()
    if want == "none":
        return None
    return _scipy() if want == "blas" else Gemm("opkit", __version__)


def blas() -> Optional[Gemm]:
    """SciPy's BLAS when it is the backend of this process, else None."""
    g = gemm()
    return g if g is not None and g.name == "blas" else None


_SET = ("scipy_openblas_set_num_threads", "openblas_set_num_threads")
_GET = ("scipy_openblas_get_num_threads", "openblas_get_num_threads")


@functools.lru_cache(maxsize=None)
def thread_controls() -> Tuple[int, int]:
    """The addresses of `openblas_set_num_threads(n)` and `openblas_get_num_threads()` of the
    library SciPy's BLAS is (0, 0 when not found). A fused call sets the library to one thread
    for its duration and splits its blocks over opkit's own threads: each GEMM runs on the
    thread that calls it, and no BLAS worker spins on a core opkit's threads need. Without
    them the blocks run on one thread (a GEMM called from several threads at once would wake
    BLAS's pool from each)."""
    if blas() is None:  # the generated micro-kernels run on the thread that calls them
        return 0, 0
    try:
        with open("/proc/self/maps") as fh:  # the libraries this process has loaded
            fields = [line.split() for line in fh]
    except OSError:
        return 0, 0
    paths = sorted({f[-1] for f in fields if len(f) >= 6 and "openblas" in f[-1].lower()
                    and ".so" in f[-1]})
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        # the 32-bit-integer BLAS SciPy calls, not NumPy's 64-bit one (its names end in 64_)
        if not any(hasattr(lib, f) for f in ("scipy_sgemm_", "sgemm_")):
            continue
        set_fn, get_fn = (next((getattr(lib, n) for n in names if hasattr(lib, n)), None)
                          for names in (_SET, _GET))
        if set_fn is not None and get_fn is not None:
            return (ctypes.cast(set_fn, ctypes.c_void_p).value or 0,
                    ctypes.cast(get_fn, ctypes.c_void_p).value or 0)
    return 0, 0
