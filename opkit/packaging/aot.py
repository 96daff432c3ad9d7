"""Modules built ahead of time: build operators for a list of ISAs through the build cache and
copy the entries into a folder a wheel ships (read-only; the runtime searches it after the
user's cache, see opkit/builder/compile.py `_shipped`).

The ISA policy: a wheel for distribution carries `portable` modules (the architecture's
baseline: they run on every CPU of it) and, on x86-64, `x86-64-v3` ones (AVX2, FMA, F16C), and
the runtime loads the best of them that the CPU runs. A local install (`pip install .`)
builds for `native`, what `opkit build` and calls use on the machine that installs it; a
shipped native module is loaded only on a CPU with every flag of the CPU it was built on.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import os
import platform
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Iterable, List, Sequence, Tuple

from ..backend import blas
from ..builder import cache
from ..errors import BuildError, FusionWarning

# what an entry folder of a wheel keeps: the module, its source and its record
_KEEP = ("meta.json",)


def distribution_isas() -> Tuple[str, ...]:
    """The ISAs a wheel for distribution is built for on this machine's architecture."""
    if platform.machine().lower() in ("x86_64", "amd64"):
        return ("portable", "x86-64-v3")
    return ("portable",)


def parse_isas(text: str) -> Tuple[str, ...]:
    """`native`, `dist` (distribution_isas()), `none`, or a comma-separated list of ISAs."""
    from ..config import ISAS
    text = (text or "").strip().lower()
    if text in ("", "1", "native"):
        return ("native",)
    if text in ("0", "none"):
        return ()
    if text == "dist":
        return distribution_isas()
    isas = tuple(p.strip() for p in text.split(",") if p.strip())
    bad = [i for i in isas if i not in ISAS]
    if bad:
        raise ValueError(f"unknown ISA {bad[0]!r}: use native, dist, none or a list of "
                         f"{', '.join(ISAS)}")
    return isas


@contextlib.contextmanager
def _build_cache():
    """Where the modules are compiled: the user's cache, so a module built once (by an earlier
    install, `opkit build` or a first call) is not compiled again, and what this build compiles
    serves later calls; a private one where the user's cache cannot be written. Shipped folders
    are never a source (OPKIT_PREBUILT=0): the folder being filled may be one of them."""
    old = {k: os.environ.get(k) for k in ("OPKIT_CACHE_DIR", "OPKIT_PREBUILT")}
    os.environ["OPKIT_PREBUILT"] = "0"
    try:
        with tempfile.TemporaryDirectory(prefix="opkit-aot-") as tmp:
            if not _writable(cache.cache_root()):
                os.environ["OPKIT_CACHE_DIR"] = tmp
            yield cache.cache_root()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _writable(root: Path) -> bool:
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=root):
            return True
    except OSError:
        return False


def build_ahead(ops: Sequence, out: Path, isas: Iterable[str], jobs: int = 0,
                report=print) -> List[str]:
    """Build every operator for every ISA (through the cache: `_build_cache`) and copy the
    entries into `out`; returns the entry names. Where the fused calls run on SciPy's BLAS
    (OPKIT_GEMM=blas), an operator with fused calls is built twice: with the BLAS and without
    (what a process without SciPy renders), so the shipped modules serve both; the default
    generated GEMM needs nothing installed, so one build serves every process."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    isas = tuple(isas)
    names: List[str] = []
    with _build_cache():
        names += _build_into(out, [(op, isa) for isa in isas for op in ops], jobs, report)
        if blas() is not None:
            work = [(op, isa) for isa in isas for op in ops if _blas_in_source(op, isa)]
            with _without_blas(), warnings.catch_warnings():
                warnings.simplefilter("ignore", FusionWarning)  # unfused on purpose
                names += _build_into(out, work, jobs, report, " without BLAS")
    return names


def _blas_in_source(op, isa: str) -> bool:
    """Whether the module of `op` differs without BLAS (it has fused calls)."""
    source = op.source(isa)
    with _without_blas():
        return op.source(isa) != source


@contextlib.contextmanager
def _without_blas():
    old = os.environ.get("OPKIT_BLAS")
    os.environ["OPKIT_BLAS"] = "none"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("OPKIT_BLAS", None)
        else:
            os.environ["OPKIT_BLAS"] = old


def _build_into(out: Path, work, jobs: int, report, label: str = "") -> List[str]:
    def one(item):
        op, isa = item
        result = op.build(isa=isa)
        report(f"  {op.name} [{isa}]{label}: " + ("in the cache" if result.cached else
                                                  f"compiled in {result.seconds:.1f}s"))
        return result
    names = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        for result in pool.map(one, work):
            names.append(_ship(result, out / result.entry.name))
    return names


def _ship(result, target: Path) -> str:
    """Copy a built entry into `target`, under its build lock (another process may be
    rebuilding it in the shared cache), and check the copy against its record."""
    if target.exists():
        shutil.rmtree(target)
    target.mkdir()
    with cache.file_lock(cache.lock_path(result.entry.name)):
        meta = cache.read_meta(result.entry) or result.meta
        for fname in list(meta["files"]) + list(_KEEP):
            shutil.copy2(result.entry / fname, target / fname)
    problem = cache.verify(target, cache.read_meta(target) or {})
    if problem:
        raise BuildError(f"the module copied from {result.entry} to {target} does not match its "
                         f"record ({problem}); run the build again")
    return target.name


def select(ops: Sequence, only: str) -> List:
    """The operators named in `only` (comma-separated; empty: all), each checked."""
    wanted = [n.strip() for n in (only or "").split(",") if n.strip()]
    if not wanted:
        return list(ops)
    known = {op.name: op for op in ops}
    bad = [n for n in wanted if n not in known]
    if bad:
        raise ValueError(f"OPKIT_AOT_OPS names {bad[0]!r}, which is not a bundled operator; "
                         f"choose from {', '.join(sorted(known))}")
    return [known[n] for n in wanted]


def main(argv=None) -> int:
    """`python -m opkit.packaging.aot --out DIR [--isa ISAS]`: the bundled operators' modules,
    built ahead of time (setup.py's build step runs this on the freshly built package)."""
    import argparse
    import time
    parser = argparse.ArgumentParser(prog="python -m opkit.packaging.aot")
    parser.add_argument("--out", required=True, help="the folder to copy the entries into")
    parser.add_argument("--isa", default="native", help="native (default), dist, none or a list")
    parser.add_argument("--ops", default="", help="only these operators (comma-separated)")
    parser.add_argument("-j", "--jobs", type=int, default=0)
    args = parser.parse_args(argv)
    import opkit
    from ..builder import compile as compile_stage
    from ..registry import REGISTRY
    compile_stage.ANNOUNCE = False  # `report` says what compiled
    ops = select([opkit.get(n) for n in opkit.list_ops() if REGISTRY.origin(n) == "opkit"],
                 args.ops)
    isas = parse_isas(args.isa)
    t0 = time.perf_counter()
    say = _reporter()
    say(f"opkit: building the kernels of {len(ops)} bundled operators ahead of time for "
        f"{', '.join(isas)}, about a minute per ISA (OPKIT_AOT=0 skips this; OPKIT_AOT_OPS picks some)")
    names = build_ahead(ops, Path(args.out), isas, args.jobs, report=say)
    say(f"opkit: {len(names)} module(s) in {time.perf_counter() - t0:.0f}s")
    return 0


def _reporter():
    """A line to stderr, and to the terminal where stderr is not one: pip keeps a build step's
    output to itself (unless -v), and a minute of silence looks like a hang."""
    import sys
    tty = None
    if not sys.stderr.isatty():
        try:
            tty = open("/dev/tty", "w")  # noqa: SIM115  (open for the process's life)
        except OSError:
            tty = None  # no terminal (CI, a service): the log has the lines

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)
        if tty is not None:
            with contextlib.suppress(OSError):
                print(line, file=tty, flush=True)
    return say


if __name__ == "__main__":
    raise SystemExit(main())
