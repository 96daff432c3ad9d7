"""The BLAS library that fused convolutions and matmuls call, picked when a module is rendered.

SciPy's BLAS (`scipy.linalg.cython_blas`, OpenBLAS in SciPy's wheels) is the backend: its
sgemm/dgemm are called without the GIL from the generated module, one GEMM per output block.
Without SciPy (or with OPKIT_BLAS=none) the fused steps run their parts one after another
(the convolution in NumPy, then the epilogue kernel): the same results, more passes over memory.
The backend's name and version are part of the generated source, and so of the cache key.
"""
from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass
from typing import Optional, Tuple


@dataclass(frozen=True)
class Blas:
    name: str           # scipy
    version: str

    def describe(self) -> str:
        return f"{self.name} {self.version} (scipy.linalg.cython_blas sgemm/dgemm)"


@functools.lru_cache(maxsize=None)
def _scipy() -> Optional[Blas]:
    try:
        import scipy
        import scipy.linalg.cython_blas  # noqa: F401  (the module the generated code cimports)
    except ImportError:
        return None
    return Blas("scipy", scipy.__version__)


def blas_disabled() -> bool:
    """OPKIT_BLAS=none (or off, 0): fused steps run unfused even where SciPy is installed."""
    return os.environ.get("OPKIT_BLAS", "").strip().lower() in ("none", "off", "0")


def blas() -> Optional[Blas]:
    """The BLAS backend of this process, or None (OPKIT_BLAS=none turns it off)."""
    return None if blas_disabled() else _scipy()


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
    if blas() is None:
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
