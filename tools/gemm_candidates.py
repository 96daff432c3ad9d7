"""Time single-precision GEMM libraries on the matrices of opkit's fused convolution.

    python tools/gemm_candidates.py                      # 9 rounds, 1 and 2 threads
    python tools/gemm_candidates.py --repeat 15 --json gemm.json --threads 1,2
    python tools/gemm_candidates.py --candidates numpy,mkl --block-rows 384,128

Cases (float32, row-major C = A·B, inputs standard normal, fixed seed):
  3x3        A [32768 x 576] · B [576 x 64]: the im2col matrix of a 3x3 convolution of
             x [8, 64, 64, 64] (NHWC) to 64 channels
  1x1        A [32768 x 64] · B [64 x 64]
  block<R>   the 3x3 product as opkit makes it: one GEMM per block of R consecutive rows of A
             (the last block shorter when R does not divide 32768), the library held to one
             thread per call; with 2 threads, two Python threads (ThreadPoolExecutor) each take
             one half of the blocks, which needs a library call that releases the GIL.
GFLOP/s = 2·M·N·K / seconds for the whole product. Each candidate runs in its own worker
process (so OpenMP runtimes and BLAS builds never meet); the parent asks the workers for one
timed sample at a time, every (candidate, case, threads) once per round in a shuffled order,
so machine load falls on all alike. A sample repeats the call until it lasts about 50 ms and
divides; the table gives the median and the range of the samples. After a sample with a
multi-threaded library call the parent pauses briefly so the library's idle threads stop
spinning before the next candidate runs. Each configuration is checked once more after timing:
its output is filled with NaN, computed again and compared with NumPy's float64 product;
"max rel err" is max|C - C64| / max|C64| (NaN if any element was left unwritten). The note
starts with "cpu": the median over samples of the CPU seconds the worker process got per
second of the sample; well below the thread count, other work on the machine took cores.

Candidates (each optional; a row says why one could not be loaded):
  opkit            opkit's generated micro-kernels (the default GEMM of its fused calls),
                   through a matmul operator declared here (the call's packing included)
  numpy            np.matmul (NumPy's bundled OpenBLAS)
  scipy            scipy.linalg.cython_blas sgemm (SciPy's OpenBLAS) called through its
                   function pointer, as opkit calls it
  scipy-openblas32 scipy_cblas_sgemm from the scipy-openblas32 wheel, through ctypes
  mkl              cblas_sgemm from the mkl wheel's libmkl_rt, through ctypes
  blis             blis.py.gemm from the blis wheel (the configuration BLIS picks itself)
  blis:<arch>      the same library's bli_sgemm_ex with the context of sub-configuration
                   <arch> (see --blis-arch), to show what its other kernels do on this CPU
  torch            torch.mm (PyTorch's own BLAS)
The wheels: opkit, numpy, scipy, scipy-openblas32, mkl, blis and a CPU build of torch.
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import json
import math
import multiprocessing as mp
import os
import random
import signal
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

ROWS = 32768
FULL = {"3x3": (ROWS, 576, 64), "1x1": (ROWS, 64, 64)}   # case: (M, K, N)
SEED = 0
SAMPLE_SECONDS = 0.05
SETTLE_SECONDS = 0.25
CBLAS_ROW_MAJOR, CBLAS_NO_TRANS = 101, 111


@dataclass
class Lib:
    version: str
    note: str
    gemm: Callable[[np.ndarray, np.ndarray, np.ndarray], None]   # c = a @ b, all C-contiguous
    set_threads: Optional[Callable[[int], None]] = None          # None: no threading of its own
    nogil: bool = True                                           # the call releases the GIL


# ---------------------------------------------------------------- the CPU

def cpu_info() -> tuple[str, str]:
    """(model, vector ISA) from /proc/cpuinfo; the ISA is avx512f, avx2 or neither."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        return "unknown", "unknown"
    model = "%s (%s, family %s, model %s)" % (fields.get("model name", "?"),
                                              fields.get("vendor_id", "?"),
                                              fields.get("cpu family", "?"),
                                              fields.get("model", "?"))
    flags = set(fields.get("flags", "").split())
    isa = "avx512f" if "avx512f" in flags else "avx2" if "avx2" in flags else "neither avx2 nor avx512f"
    return model, isa


def load_average() -> str:
    """The 1, 5 and 15 minute load averages: how busy the machine was around the run."""
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "unknown"


# ---------------------------------------------------------------- loaders

def _one(pattern: str) -> str:
    found = sorted(glob.glob(pattern))
    if not found:
        raise FileNotFoundError("no file matches " + pattern)
    return found[0]


def _openblas(path: str, suffix: str) -> tuple[ctypes.CDLL, str, str, Callable[[int], None]]:
    """A scipy-openblas build (symbols prefixed scipy_, `suffix` after the name): the library,
    its version, its core name and its thread-count setter."""
    lib = ctypes.CDLL(path)
    get_config = getattr(lib, "scipy_openblas_get_config" + suffix)
    get_core = getattr(lib, "scipy_openblas_get_corename" + suffix)
    get_config.restype = get_core.restype = ctypes.c_char_p
    setter = getattr(lib, "scipy_openblas_set_num_threads" + suffix)
    setter.argtypes = [ctypes.c_int]
    version = get_config().decode().split()[1]
    return lib, version, get_core().decode(), setter


def _cblas_gemm(fn) -> Callable[[np.ndarray, np.ndarray, np.ndarray], None]:
    i, f, p = ctypes.c_int, ctypes.c_float, ctypes.c_void_p
    fn.argtypes = [i, i, i, i, i, i, f, p, i, p, i, f, p, i]
    fn.restype = None

    def gemm(a, b, c):
        m, k = a.shape
        n = b.shape[1]
        fn(CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_NO_TRANS, m, n, k, 1.0, a.ctypes.data, k,
           b.ctypes.data, n, 0.0, c.ctypes.data, n)
    return gemm


def load_numpy() -> Lib:
    libs = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
    _, version, core, setter = _openblas(_one(os.path.join(libs, "*openblas*.so*")), "64_")

    def gemm(a, b, c):
        np.matmul(a, b, out=c)
    return Lib("NumPy %s / OpenBLAS %s" % (np.__version__, version), "OpenBLAS core " + core,
               gemm, setter)


def _capsule_pointer(capsule) -> int:
    api = ctypes.pythonapi
    api.PyCapsule_GetName.restype = ctypes.c_char_p
    api.PyCapsule_GetName.argtypes = [ctypes.py_object]
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return api.PyCapsule_GetPointer(capsule, api.PyCapsule_GetName(capsule))


def load_scipy() -> Lib:
    import scipy
    from scipy.linalg import cython_blas

    libs = os.path.join(os.path.dirname(os.path.dirname(scipy.__file__)), "scipy.libs")
    _, version, core, setter = _openblas(_one(os.path.join(libs, "*openblas*.so*")), "")
    pc, pi, pf = ctypes.POINTER(ctypes.c_char), ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_float)
    proto = ctypes.CFUNCTYPE(None, pc, pc, pi, pi, pi, pf, pf, pi, pf, pi, pf, pf, pi)
    sgemm = proto(_capsule_pointer(cython_blas.__pyx_capi__["sgemm"]))
    t, one, zero = ctypes.c_char(b"N"), ctypes.c_float(1.0), ctypes.c_float(0.0)

    def gemm(a, b, c):   # column-major C^T [N x M] = B^T [N x K] · A^T [K x M]
        m, k = a.shape
        n = b.shape[1]
        mi, ni, ki = ctypes.c_int(n), ctypes.c_int(m), ctypes.c_int(k)
        r = ctypes.byref
        sgemm(r(t), r(t), r(mi), r(ni), r(ki), r(one), b.ctypes.data_as(pf), r(mi),
              a.ctypes.data_as(pf), r(ki), r(zero), c.ctypes.data_as(pf), r(mi))
    return Lib("SciPy %s / OpenBLAS %s" % (scipy.__version__, version),
               "cython_blas sgemm; OpenBLAS core " + core, gemm, setter)


def load_scipy_openblas32() -> Lib:
    import scipy_openblas32

    path = os.path.join(scipy_openblas32.get_lib_dir(), "lib%s.so" % scipy_openblas32.get_library())
    lib, version, core, setter = _openblas(path, "")
    return Lib("scipy-openblas32 %s / OpenBLAS %s" % (scipy_openblas32.__version__, version),
               "OpenBLAS core " + core, _cblas_gemm(lib.scipy_cblas_sgemm), setter)


def _mkl_loaded() -> str:
    """The CPU-specific MKL libraries this process mapped (libmkl_def, _avx2, _avx512 ...)."""
    names = set()
    with open("/proc/self/maps") as f:
        for line in f:
            base = os.path.basename(line.split()[-1])
            if base.startswith("libmkl_") and not base.startswith(("libmkl_rt", "libmkl_core")) \
                    and "thread" not in base and "lp64" not in base:
                names.add(base.split(".so")[0])
    return ", ".join(sorted(names)) or "none"


def load_mkl() -> Lib:
    lib = ctypes.CDLL(_one(os.path.join(sys.prefix, "lib", "libmkl_rt.so*")))
    buf = ctypes.create_string_buffer(256)
    lib.MKL_Get_Version_String(buf, len(buf))
    version = buf.value.decode().replace("Intel(R) oneAPI Math Kernel Library Version ", "MKL ")
    version = version.split("-")[0].split(" for ")[0]
    lib.MKL_Set_Num_Threads.argtypes = [ctypes.c_int]
    gemm = _cblas_gemm(lib.cblas_sgemm)
    x = np.ones((64, 64), np.float32)
    gemm(x, x, np.empty_like(x))   # loads the CPU-specific library
    return Lib(version, "CPU library " + _mkl_loaded(), gemm, lib.MKL_Set_Num_Threads)


def _blis_lib():
    import blis.cy

    lib = ctypes.CDLL(blis.cy.__file__)
    lib.bli_init()
    lib.bli_arch_string.restype = ctypes.c_char_p
    lib.bli_arch_string.argtypes = [ctypes.c_int]
    lib.bli_info_get_version_str.restype = ctypes.c_char_p
    lib.bli_gks_lookup_nat_cntx.restype = ctypes.c_void_p
    lib.bli_gks_lookup_nat_cntx.argtypes = [ctypes.c_int]
    return lib


def blis_configs(lib) -> dict[str, int]:
    """The sub-configurations the library was built with (it exports bli_cntx_init_<name>):
    name -> arch id. Arch ids run up to 'generic', the last."""
    found = {}
    for arch in range(64):
        name = lib.bli_arch_string(arch).decode()
        if hasattr(lib, "bli_cntx_init_" + name):
            found[name] = arch
        if name == "generic":
            break
    return found


def _blis_version(lib) -> str:
    from blis.about import __version__

    threading = "threaded" if lib.bli_info_get_enable_threading() else "no threading"
    return "blis %s / BLIS %s (%s)" % (__version__, lib.bli_info_get_version_str().decode(),
                                       threading)


def load_blis() -> Lib:
    from blis.py import gemm as blis_gemm

    lib = _blis_lib()
    picked = lib.bli_arch_string(lib.bli_arch_query_id()).decode()

    def gemm(a, b, c):
        blis_gemm(a, b, out=c, beta=0.0)
    note = "picks '%s'; built with %s" % (picked, " ".join(blis_configs(lib)))
    setter = None if not lib.bli_info_get_enable_threading() else lib.bli_thread_set_num_threads
    return Lib(_blis_version(lib), note, gemm, setter)


def load_blis_arch(arch: str) -> Lib:
    lib = _blis_lib()
    configs = blis_configs(lib)
    if arch not in configs:
        raise LookupError("BLIS has no sub-configuration %r (it has %s)" % (arch, " ".join(configs)))
    cntx = lib.bli_gks_lookup_nat_cntx(configs[arch])
    i, d, p = ctypes.c_int, ctypes.c_long, ctypes.c_void_p
    fn = lib.bli_sgemm_ex
    fn.argtypes = [i, i, d, d, d, p, p, d, d, p, d, d, p, p, d, d, p, p]
    fn.restype = None
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)

    def gemm(a, b, c):   # bli_sgemm_ex(transa, transb, m, n, k, alpha, a, rs, cs, ..., cntx, rntm)
        m, k = a.shape
        n = b.shape[1]
        fn(0, 0, m, n, k, ctypes.byref(one), a.ctypes.data, k, 1, b.ctypes.data, n, 1,
           ctypes.byref(zero), c.ctypes.data, n, 1, cntx, None)
    return Lib(_blis_version(lib), "context '%s' forced (bli_sgemm_ex)" % arch, gemm, None)


def load_torch() -> Lib:
    import torch

    blas = "?"
    for line in torch.__config__.show().splitlines():
        if "Math Kernel Library Version" in line:
            blas = "MKL " + line.split("Version")[1].split("-")[0].strip()

    def gemm(a, b, c):
        torch.mm(torch.from_numpy(a), torch.from_numpy(b), out=torch.from_numpy(c))
    note = "%s inside; CPU capability %s" % (blas, torch.backends.cpu.get_cpu_capability())
    return Lib("PyTorch " + torch.__version__, note, gemm, torch.set_num_threads)


_OPKIT_GEMM = """name: gemm_candidate
summary: c = a @ b on the GEMM of opkit's fused convolutions (a 1 x 1 convolution).
inputs:
  a: {dtypes: [float32], shape: [M, K]}
  b: {dtypes: [float32], shape: [K, C]}
outputs:
  c: {}
forward:
  c: matmul(a, b)
"""


def load_opkit() -> Lib:
    """opkit's generated micro-kernels (the default GEMM of its fused calls), through an
    operator declared here: the call packs the weights, copies each block's rows and runs the
    register tiles, so its time includes what a fused convolution adds around the GEMM."""
    import tempfile

    import opkit
    from opkit.backend import gemm as backend
    from opkit.builder import toolchain
    folder = tempfile.mkdtemp(prefix="opkit-gemm-")
    with open(os.path.join(folder, "gemm_candidate.yaml"), "w") as fh:
        fh.write(_OPKIT_GEMM)
    opkit.load(folder)
    op = opkit.get("gemm_candidate")
    op.build()

    def gemm(a, b, c):
        op(a, b, out=c)
    lib = backend()
    note = lib.describe(toolchain().target.vector_bytes) if lib else "no GEMM backend"
    return Lib("opkit " + opkit.__version__, note, gemm,
               lambda n: opkit.configure(num_threads=n))


LOADERS = {
    "opkit": load_opkit,
    "numpy": load_numpy,
    "scipy": load_scipy,
    "scipy-openblas32": load_scipy_openblas32,
    "mkl": load_mkl,
    "blis": load_blis,
    "torch": load_torch,
}


def load(name: str) -> Lib:
    if name.startswith("blis:"):
        return load_blis_arch(name.split(":", 1)[1])
    return LOADERS[name]()


# ---------------------------------------------------------------- the worker

def make_data() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(SEED)
    return {case: (rng.standard_normal((m, k), dtype=np.float32),
                   rng.standard_normal((k, n), dtype=np.float32))
            for case, (m, k, n) in FULL.items()}


def block_rows(case: str) -> int:
    return int(case[len("block"):])


def make_run(lib: Lib, case: str, threads: int, data, out, pool) -> Callable[[], None]:
    """One run of a case: the full product, or every row block of the 3x3 product."""
    if not case.startswith("block"):
        a, b = data[case]
        c = out[case]
        return lambda: lib.gemm(a, b, c)
    a, b = data["3x3"]
    c = out[case]
    r = block_rows(case)
    blocks = [(a[i:i + r], c[i:i + r]) for i in range(0, a.shape[0], r)]

    def run_blocks(part):
        for ai, ci in part:
            lib.gemm(ai, b, ci)
    if threads == 1:
        return lambda: run_blocks(blocks)
    half = (len(blocks) + 1) // 2

    def run_two():
        for f in [pool.submit(run_blocks, blocks[:half]), pool.submit(run_blocks, blocks[half:])]:
            f.result()
    return run_two


def max_rel_err(c: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(c - ref)) / np.max(np.abs(ref)))


def worker(conn, name: str) -> None:
    """Serve ("warm" | "time" | "check", case, threads) requests for one candidate."""
    try:
        lib = load(name)
    except BaseException as e:   # any failure becomes the row's note
        conn.send(("error", "%s: %s" % (type(e).__name__, e)))
        return
    conn.send(("ok", lib.version, lib.note, lib.set_threads is not None, lib.nogil))
    data = make_data()
    out = {}
    refs = {}
    inner = {}
    pool = ThreadPoolExecutor(2)
    while True:
        msg = conn.recv()
        if msg is None:
            break
        try:
            conn.send(serve(lib, msg, data, out, refs, inner, pool))
        except Exception as e:   # the row's note
            conn.send("%s: %s" % (type(e).__name__, e))
    pool.shutdown()


def serve(lib: Lib, msg, data, out, refs, inner, pool):
    """warm: two runs, and how many runs make a sample; time: seconds per run and the CPU
    seconds the process got per second; check: the max relative error of a fresh run."""
    op, case, threads = msg
    full = not case.startswith("block")
    key = case if full else "3x3"
    if case not in out:
        out[case] = np.empty((data[key][0].shape[0], data[key][1].shape[1]), np.float32)
    if lib.set_threads is not None:
        lib.set_threads(threads if full else 1)
    run = make_run(lib, case, threads, data, out, pool)
    if op == "warm":
        run()
        t0 = time.perf_counter()
        run()
        inner[case, threads] = max(1, math.ceil(SAMPLE_SECONDS / (time.perf_counter() - t0)))
        return 0.0
    if op == "time":
        n = inner[case, threads]
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(n):
            run()
        wall = time.perf_counter() - t0
        return wall / n, (time.process_time() - c0) / wall
    if key not in refs:
        a, b = data[key]
        refs[key] = a.astype(np.float64) @ b.astype(np.float64)
    out[case].fill(np.nan)
    run()
    return max_rel_err(out[case], refs[key])


# ---------------------------------------------------------------- the parent

@dataclass
class Row:
    candidate: str
    version: str
    case: str
    threads: int
    note: str
    seconds: list
    cpu: list = field(default_factory=list)
    err: Optional[float] = None
    failed: str = ""

    def gflops(self) -> list:
        if not self.seconds:
            return []
        m, k, n = FULL["3x3" if self.case.startswith("block") else self.case]
        return sorted(2.0 * m * n * k / s / 1e9 for s in self.seconds)


def exit_reason(code: Optional[int]) -> str:
    if code is not None and code < 0:
        try:
            return "killed by " + signal.Signals(-code).name
        except ValueError:
            pass
    return "died (exit code %s)" % code


class Worker:
    def __init__(self, ctx, name: str):
        self.name = name
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=worker, args=(child, name), daemon=True)
        self.proc.start()
        child.close()
        self.dead = ""

    def ask(self, msg):
        try:
            self.conn.send(msg)
            return self.conn.recv()
        except (EOFError, OSError):
            self.proc.join(5)
            self.dead = "worker " + exit_reason(self.proc.exitcode)
            return None

    def close(self):
        if not self.dead:
            try:
                self.conn.send(None)
            except OSError:
                pass
        self.proc.join(10)


def start_workers(names: list, cases: list, threads: list):
    """Load every candidate in its own process; rows for all its configurations."""
    ctx = mp.get_context("spawn")
    workers, rows = {}, []
    for name in names:
        w = Worker(ctx, name)
        try:
            hello = w.conn.recv()
        except EOFError:
            w.proc.join(5)
            hello = ("error", "worker %s while loading" % exit_reason(w.proc.exitcode))
        if hello[0] != "ok":
            rows.append(Row(name, "-", "-", 0, "not loaded: " + hello[1], []))
            w.close()
            continue
        _, version, note, threaded, nogil = hello
        workers[name] = w
        for case in cases:
            for t in threads:
                row = Row(name, version, case, t, note, [])
                full = not case.startswith("block")
                if t > 1 and full and not threaded:
                    row.note = "n/a: built without threading; " + note
                elif t > 1 and not full and not nogil:
                    row.note = "n/a: the call holds the GIL; " + note
                elif t > 1 and not full:
                    row.note = "%d Python threads; %s" % (t, note)
                rows.append(row)
    return workers, rows


def runnable(row: Row, workers) -> bool:
    w = workers.get(row.candidate)
    return w is not None and not w.dead and not row.failed and not row.note.startswith("n/a")


def ask(row: Row, workers, op: str):
    """One request for the row's configuration; an error ends the row."""
    w = workers[row.candidate]
    answer = w.ask((op, row.case, row.threads))
    if isinstance(answer, str) or answer is None:
        row.failed = answer or w.dead
        return None
    return answer


def measure(rows: list, workers, repeat: int) -> None:
    for row in rows:
        if runnable(row, workers):
            ask(row, workers, "warm")
    shuffle = random.Random(SEED)
    for _ in range(repeat):
        order = [r for r in rows if runnable(r, workers)]
        shuffle.shuffle(order)
        for row in order:
            if not runnable(row, workers):
                continue
            answer = ask(row, workers, "time")
            if answer is not None:
                row.seconds.append(answer[0])
                row.cpu.append(answer[1])
            if row.threads > 1 and not row.case.startswith("block"):
                time.sleep(SETTLE_SECONDS)
    for row in rows:
        if runnable(row, workers):
            row.err = ask(row, workers, "check")
    for row in rows:
        w = workers.get(row.candidate)
        failed = row.failed or (w.dead if w is not None else "")
        if failed and not row.note.startswith("n/a"):
            row.note = "failed: %s; %s" % (failed, row.note)


def table(rows: list) -> str:
    out = ["| candidate | library | case | threads | GFLOP/s median | min–max | max rel err | note |",
           "| --- | --- | --- | --- | ---: | --- | --- | --- |"]
    for r in rows:
        g = r.gflops()
        med = "%.1f" % statistics.median(g) if g else "-"
        rng = "%.1f–%.1f" % (g[0], g[-1]) if g else "-"
        err = "%.1e" % r.err if r.err is not None else "-"
        note = ("cpu %.2f; " % statistics.median(r.cpu) if r.cpu else "") + r.note
        out.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r.candidate, r.version, r.case, r.threads or "-", med, rng, err, note))
    return "\n".join(out)


def to_json(rows: list, cpu: str, isa: str, repeat: int) -> dict:
    items = []
    for r in rows:
        g = r.gflops()
        items.append({"candidate": r.candidate, "library": r.version, "case": r.case,
                      "threads": r.threads, "gflops_median": statistics.median(g) if g else None,
                      "gflops_min": g[0] if g else None, "gflops_max": g[-1] if g else None,
                      "gflops_samples": g, "cpu_per_wall": r.cpu, "max_rel_err": r.err,
                      "note": r.note})
    return {"cpu": cpu, "isa": isa, "repeat": repeat, "rows": items}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeat", type=int, default=9, help="timed samples per configuration")
    p.add_argument("--json", metavar="OUT", help="also write the results as JSON")
    p.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    p.add_argument("--block-rows", default="384", help="rows per GEMM of the block cases")
    p.add_argument("--blis-arch", default="skx,zen2",
                   help="BLIS sub-configurations to force as extra rows ('' for none)")
    p.add_argument("--candidates", default=",".join(LOADERS),
                   help="comma-separated, from: %s, blis:<arch>" % ", ".join(LOADERS))
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    threads = [int(t) for t in args.threads.split(",") if t]
    cases = list(FULL) + ["block%d" % int(r) for r in args.block_rows.split(",") if r]
    names = [n for n in args.candidates.split(",") if n]
    if "blis" in names:
        at = names.index("blis") + 1
        names[at:at] = ["blis:" + a for a in args.blis_arch.split(",") if a]
    cpu, isa = cpu_info()
    print("CPU: %s; vector ISA: %s; %d logical CPUs" % (cpu, isa, os.cpu_count() or 0))
    print("Python %s; %d samples per configuration; load average %s" % (
        sys.version.split()[0], args.repeat, load_average()), flush=True)
    workers, rows = start_workers(names, cases, threads)
    try:
        measure(rows, workers, args.repeat)
    finally:
        for w in workers.values():
            w.close()
    print("load average after: %s\n" % load_average())
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(to_json(rows, cpu, isa, args.repeat), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
