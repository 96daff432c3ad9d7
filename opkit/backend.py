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
from typing import Optional


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


def blas() -> Optional[Blas]:
    """The BLAS backend of this process, or None (OPKIT_BLAS=none turns it off)."""
    if os.environ.get("OPKIT_BLAS", "").strip().lower() in ("none", "off", "0"):
        return None
    return _scipy()


_LOCAL = (b"openblas_set_num_threads_local", b"scipy_openblas_set_num_threads_local")


@functools.lru_cache(maxsize=None)
def thread_setter() -> int:
    """The address of OpenBLAS's per-thread `openblas_set_num_threads_local(n)` in the library
    SciPy loaded (0 when there is none): each of opkit's threads runs its own GEMMs on one
    thread, instead of every call waking BLAS's own pool (whose spinning threads would compete
    with opkit's for the same cores)."""
    if blas() is None:
        return 0
    try:
        with open("/proc/self/maps") as fh:  # the libraries this process has loaded
            fields = [line.split() for line in fh]
        paths = sorted({f[-1] for f in fields if len(f) >= 6 and "openblas" in f[-1].lower()
                        and ".so" in f[-1]})
    except OSError:
        return 0
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _LOCAL:
            fn = getattr(lib, name.decode(), None)
            if fn is not None:
                return ctypes.cast(fn, ctypes.c_void_p).value or 0
    return 0
