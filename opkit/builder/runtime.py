"""The kernel runtime and the GEMM micro-kernels as object files per toolchain, in the cache,
linked into the modules.

templates/opkit_kernel.h's walk (opk_run, opk_walk and what they call: the row and block
loops, float16 streaming, folded sums, chunked partials) is the largest code of every module
and the same in all of them: it reaches a kernel only through the function pointers of
opk_kernel. Compiled with OPK_RUNTIME into `opk_runtime.o` once, keyed like a module (its
source, the templates, the toolchain), it is linked into each module instead of being compiled
again for each operator. The fused calls' GEMM micro-kernels (codegen/gemm.py) depend only on
the target's vectors too; they are a second object, `opk_gemm.o`, built the first time a
module that calls them is (a fused convolution, a convolution gradient), so that the modules
without them never wait for it. A module that links them is self-contained: the objects are
only needed while modules are being built. Like a module, an object is used only while it
matches the size and sha256 recorded when it was built (`runtime.json`); a damaged one is
compiled again.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from ..codegen import template_digest
from ..codegen.render import gemm_source, runtime_source, uses_gemm
from ..errors import BuildError
from . import cache
from .toolchain import Toolchain
from .tools import run_tool

RUNTIME, GEMM = "opk_runtime", "opk_gemm"
_RECORD = "runtime.json"
_WHAT = {RUNTIME: ("opkit's kernel runtime, templates/opkit_kernel.h with OPK_RUNTIME",
                   "every module links this object, so no operator can be built until it "
                   "compiles"),
         GEMM: ("opkit's GEMM micro-kernels, codegen/gemm.py's",
                "the fused convolutions link this object; OPKIT_GEMM=blas or none builds them "
                "without it")}


def _source(name: str, tc: Toolchain) -> str:
    return (runtime_source if name == RUNTIME else gemm_source)(tc.target.vector_bytes)


def runtime_key(tc: Toolchain, name: str = RUNTIME) -> str:
    source = _source(name, tc)
    return cache.cache_key({"runtime": hashlib.sha256(source.encode()).hexdigest(),
                            "templates": template_digest(), "toolchain": tc.key_material()})


def _sound(entry: Path) -> bool:
    """Whether the entry's object matches its record (cache.verify, as for a module)."""
    try:
        record = json.loads((entry / _RECORD).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and not cache.verify(entry, record)


def runtime_object(tc: Toolchain, timeout: float, name: str = RUNTIME) -> Path:
    """The compiled runtime (or, with name=GEMM, the GEMM micro-kernels) for `tc`, built into
    the cache the first time it is asked for (under the entry's lock: concurrent builds,
    threads or processes, compile it once)."""
    entry = cache.entry_dir(name, runtime_key(tc, name))
    c_file, o_file = f"{name}.c", f"{name}.o"
    if _sound(entry):
        return entry / o_file
    with cache.file_lock(cache.lock_path(entry.name)):
        if _sound(entry):  # another build finished it while this one waited
            return entry / o_file
        work = cache.new_workdir(name, entry.name[-16:])
        try:
            (work / c_file).write_text(_source(name, tc))
            cmd = tc.object_command(c_file, o_file)
            r = run_tool(cmd, work, timeout)
            if r.returncode != 0 or not (work / o_file).is_file():
                tail = "\n".join(((r.stdout or "") + (r.stderr or "")).strip().splitlines()[-15:])
                what, why = _WHAT[name]
                raise BuildError(
                    f"{cmd[0]} failed to compile {what} (exit status {r.returncode}) with the "
                    f"flags {' '.join(tc.cflags)}:\n{tail}\n  (check CC and OPKIT_CFLAGS: {why})")
            # a module's meta.json record, as cache.verify reads it ("so" names the object,
            # "pyx" its source)
            record = {"so": o_file, "pyx": c_file,
                      "files": {f: cache.file_record(work / f) for f in (o_file, c_file)}}
            cache.write_json_atomic(work / _RECORD, record)
            cache.publish(work, entry)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return entry / o_file


def objects_for(source: str, tc: Toolchain, timeout: float) -> list:
    """The objects a module with this source links: the runtime, and the GEMM micro-kernels
    when it calls them."""
    objects = [runtime_object(tc, timeout)]
    if uses_gemm(source):
        objects.append(runtime_object(tc, timeout, GEMM))
    return objects
