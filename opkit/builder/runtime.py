"""The kernel runtime as one object file per toolchain, in the cache, linked into every module.

templates/opkit_kernel.h's walk (opk_run, opk_walk and what they call: the row and block
loops, float16 streaming, folded sums, chunked partials) is the largest code of every module
and the same in all of them: it reaches a kernel only through the function pointers of
opk_kernel. So are the fused calls' GEMM micro-kernels (codegen/gemm.py), which depend only
on the target's vectors. Compiled with OPK_RUNTIME into `opk_runtime.o` once, keyed like a
module (its source, the templates, the toolchain), it is linked into each module instead of
being compiled again for each operator. The module that links it is self-contained: the object is only needed
while modules are being built. Like a module, the object is used only while it matches the
size and sha256 recorded when it was built (`runtime.json`); a damaged one is compiled again.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from ..codegen import template_digest
from ..codegen.render import runtime_source
from ..errors import BuildError
from . import cache
from .toolchain import Toolchain
from .tools import run_tool

_NAME = "opk_runtime"
_C, _O, _RECORD = f"{_NAME}.c", f"{_NAME}.o", "runtime.json"


def runtime_key(tc: Toolchain) -> str:
    source = runtime_source(tc.target.vector_bytes)
    return cache.cache_key({"runtime": hashlib.sha256(source.encode()).hexdigest(),
                            "templates": template_digest(), "toolchain": tc.key_material()})


def _sound(entry: Path) -> bool:
    """Whether the entry's object matches its record (cache.verify, as for a module)."""
    try:
        record = json.loads((entry / _RECORD).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and not cache.verify(entry, record)


def runtime_object(tc: Toolchain, timeout: float) -> Path:
    """The compiled runtime for `tc`, built into the cache the first time it is asked for
    (under the entry's lock: concurrent builds, threads or processes, compile it once)."""
    entry = cache.entry_dir(_NAME, runtime_key(tc))
    if _sound(entry):
        return entry / _O
    with cache.file_lock(cache.lock_path(entry.name)):
        if _sound(entry):  # another build finished it while this one waited
            return entry / _O
        work = cache.new_workdir(_NAME, entry.name[-16:])
        try:
            (work / _C).write_text(runtime_source(tc.target.vector_bytes))
            cmd = tc.object_command(_C, _O)
            r = run_tool(cmd, work, timeout)
            if r.returncode != 0 or not (work / _O).is_file():
                tail = "\n".join(((r.stdout or "") + (r.stderr or "")).strip().splitlines()[-15:])
                raise BuildError(
                    f"{cmd[0]} failed to compile opkit's kernel runtime (templates/opkit_kernel.h "
                    f"with OPK_RUNTIME; exit status {r.returncode}) with the flags "
                    f"{' '.join(tc.cflags)}:\n{tail}\n  (check CC and OPKIT_CFLAGS: every module "
                    "links this object, so no operator can be built until it compiles)")
            # a module's meta.json record, as cache.verify reads it ("so" names the object,
            # "pyx" its source)
            record = {"so": _O, "pyx": _C, "files": {f: cache.file_record(work / f) for f in (_O, _C)}}
            cache.write_json_atomic(work / _RECORD, record)
            cache.publish(work, entry)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return entry / _O
