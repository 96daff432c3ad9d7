"""The kernel runtime as one object file per toolchain, in the cache, linked into every module.

templates/opkit_kernel.h's walk (opk_run, opk_walk and what they call: the row and block
loops, float16 streaming, folded sums, chunked partials) is the largest code of every module
and the same in all of them: it reaches a kernel only through the function pointers of
opk_kernel. Compiled with OPK_RUNTIME into `opk_runtime.o` once, keyed like a module (its
source, the templates, the toolchain), it is linked into each module instead of being compiled
again for each operator. The module that links it is self-contained: the object is only needed
while modules are being built.
"""
from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from ..codegen import template_digest
from ..codegen.render import runtime_source
from ..errors import BuildError
from . import cache, reaper
from .toolchain import Toolchain

_NAME = "opk_runtime"


def runtime_key(tc: Toolchain) -> str:
    return cache.cache_key({"runtime": hashlib.sha256(runtime_source().encode()).hexdigest(),
                            "templates": template_digest(), "toolchain": tc.key_material()})


def runtime_object(tc: Toolchain, timeout: float) -> Path:
    """The compiled runtime for `tc`, built into the cache the first time it is asked for
    (under the entry's lock: concurrent builds, threads or processes, compile it once)."""
    entry = cache.entry_dir(_NAME, runtime_key(tc))
    obj = entry / f"{_NAME}.o"
    if obj.is_file():
        return obj
    with cache.file_lock(cache.lock_path(entry.name)):
        if obj.is_file():  # another build finished it while this one waited
            return obj
        work = cache.new_workdir(_NAME, entry.name[-16:])
        try:
            (work / f"{_NAME}.c").write_text(runtime_source())
            cmd = tc.object_command(f"{_NAME}.c", f"{_NAME}.o")
            try:
                r = reaper.run(cmd, work, timeout)
            except Exception as exc:  # not found, not runnable, timed out
                raise BuildError(f"cannot compile opkit's kernel runtime with {cmd[0]}: {exc}") from None
            if r.returncode != 0 or not (work / f"{_NAME}.o").is_file():
                tail = "\n".join(((r.stdout or "") + (r.stderr or "")).strip().splitlines()[-15:])
                raise BuildError(f"{cmd[0]} failed to compile opkit's kernel runtime (exit status "
                                 f"{r.returncode}); its flags: {' '.join(tc.cflags)}:\n{tail}")
            cache.publish(work, entry)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return obj
