"""Cython source → compiled extension module in the cache.

The cache key is a sha256 over the generated source, the templates, the declaration and the
toolchain (opkit, Cython, NumPy and Python versions, compiler, flags, CPU features). Each entry
also records a content key (the same without the compiler) and the size and sha256 of its files:
without a compiler, a sound module built for the same content by any compiler is used, and a
module that does not match its record is never loaded. A failed compile is reported with the
generated line and the declaration line it came from.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Tuple

from .._paths import templates_dir
from ..codegen import template_digest
from ..errors import BuildError
from . import cache
from ..target import cpu_flags
from .runtime import objects_for
from .toolchain import Toolchain
from .tools import run_tool
from .vecreport import parse_report, pyx_lines


@dataclass
class BuildResult:
    name: str
    key: str
    entry: Path
    module_name: str
    cached: bool
    seconds: float
    meta: dict = field(default_factory=dict)

    @property
    def so_path(self) -> Path:
        return self.entry / self.meta["so"]

    @property
    def source_path(self) -> Path:
        return self.entry / self.meta["pyx"]

    def load(self):
        """Import the module, after checking it against its recorded size and sha256."""
        problem = cache.verify(self.entry, self.meta)
        if problem:
            raise BuildError(f"the cached module {self.so_path} is damaged ({problem}); build it "
                             "again (`opkit build`, or call the operator again)")
        try:
            return cache.load_module(self.so_path, self.module_name)
        except ImportError as exc:
            raise BuildError(f"cannot load the cached module {self.so_path}: {exc}; remove it "
                             "with `opkit clean` and build again") from None


def _material(name: str, source: str, spec_canonical: dict, toolchain_material: dict) -> dict:
    return {
        "name": name,
        "source": hashlib.sha256(source.encode()).hexdigest(),
        "templates": template_digest(),
        "spec": spec_canonical,
        "toolchain": toolchain_material,
    }


def key_for(name: str, source: str, spec_canonical: dict, tc: Toolchain) -> str:
    return cache.cache_key(_material(name, source, spec_canonical, tc.key_material()))


def content_key(name: str, source: str, spec_canonical: dict, tc: Toolchain) -> str:
    """The key of what is built, whatever compiler builds it."""
    return cache.cache_key(_material(name, source, spec_canonical, tc.content_material()))


# The GEMM line of a module whose fused calls run on SciPy's BLAS (OPKIT_GEMM=blas) names
# SciPy's version; a shipped module runs with any SciPy, since cython_blas's functions are
# looked up by name when the module is imported
_BLAS_VERSION = re.compile(r"^(# GEMM: SciPy) [^ (]+ (BLAS \()", re.M)


def ship_key(name: str, source: str, spec_canonical: dict, tc: Toolchain) -> str:
    """The key a module built ahead of time is found by (see Toolchain.ship_material): the
    source without SciPy's version."""
    source = _BLAS_VERSION.sub(r"\1 \2", source)
    return cache.cache_key(_material(name, source, spec_canonical, tc.ship_material()))


def _result(name: str, entry: Path, meta: dict) -> BuildResult:
    return BuildResult(name, meta["key"], entry, meta["module"], True, 0.0, meta)


def _hit(name: str, entry: Path) -> Optional[BuildResult]:
    meta = cache.read_meta(entry)
    if meta and not cache.verify(entry, meta):
        return _result(name, entry, meta)
    return None


def build(name: str, source: str, spec_canonical: dict, tc: Toolchain, force: bool = False,
          env_timeout: float = 900.0) -> BuildResult:
    """Compile `source` (the module of operator `name`) unless the cache already has it."""
    ckey = content_key(name, source, spec_canonical, tc)
    skey = ship_key(name, source, spec_canonical, tc)
    if not tc.available:
        return _without_compiler(name, ckey, skey, tc, force)
    key = key_for(name, source, spec_canonical, tc)
    entry = cache.entry_dir(name, key)
    if not force:
        hit = _hit(name, entry) or _shipped(name, skey, tc)
        if hit:
            return hit
    try:
        with cache.file_lock(cache.lock_path(entry.name)):
            if not force:
                hit = _hit(name, entry)  # another process finished it while we waited
                if hit:
                    return hit
            return _compile(name, (key, ckey, skey), entry, source, tc, env_timeout)
    except OSError as exc:  # commands report their own errors: this is the cache folder
        raise cache.unwritable(exc) from None


def _shipped(name: str, skey: str, tc: Toolchain,
             refused: Optional[List[str]] = None) -> Optional[BuildResult]:
    """A sound module built ahead of time for this content that this process can load: the
    same ship key, NumPy compatible, and a native module only on a CPU with every flag of the
    CPU it was built on. `refused` collects why each one built for this content is not used."""
    from ..target import missing_flags
    for entry, meta in cache.shipped_entries(name):
        content = meta.get("content") or {}
        if content.get("ship") != skey:
            continue  # another operator's content, version or ISA
        numpy = (content.get("toolchain") or {}).get("numpy", "")
        lacking = missing_flags(tc.target.isa, tuple(meta.get("cpu_flags", ("?",))))
        if not cache.numpy_compatible(numpy, tc.numpy_version):
            problem = (f"it was built against NumPy {numpy or '(unknown)'} and runs on that or a "
                       f"newer NumPy of the same major version; this process has {tc.numpy_version}")
        elif lacking:
            problem = f"it needs CPU features this CPU lacks: {', '.join(lacking)}"
        else:
            problem = cache.verify(entry, meta)
            if not problem:
                return _result(name, entry, meta)
        if refused is not None:
            refused.append(f"the shipped module {entry} is not used: {problem}")
    return None


def _without_compiler(name: str, ckey: str, skey: str, tc: Toolchain, force: bool) -> BuildResult:
    """The newest sound module built for the same content by any compiler (in the cache, then
    the shipped ones), else why not."""
    damaged = ""
    for entry, meta in ([] if force else cache.entries(name)):
        if (meta.get("content") or {}).get("key") != ckey:
            continue
        problem = cache.verify(entry, meta)
        if not problem:
            return _result(name, entry, meta)
        damaged = damaged or f"the cached module {entry / str(meta.get('so'))} is damaged ({problem}); "
    refused: List[str] = []
    shipped = None if force else _shipped(name, skey, tc, refused)
    if shipped is not None:
        return shipped
    # the reason alone (no operator name): `opkit build` then reports many operators in one line
    error = BuildError(damaged + tc.missing + ("; then run `opkit build` (or call the operator "
                                               "again) to rebuild it" if damaged else "")
                       + "".join("; " + r for r in refused))
    error.refused = refused  # (the fallback to another ISA's shipped module reports these)
    raise error


# A compile takes seconds: the first call of a new operator says so on stderr, unless a
# progress display already does (`opkit build` and the ahead-of-time build turn this off) or
# OPKIT_QUIET is set.
ANNOUNCE = True


def _announce(name: str) -> None:
    if ANNOUNCE and not os.environ.get("OPKIT_QUIET"):
        print(f"opkit: compiling {name} (new or changed: several seconds, once; then cached in "
              f"{cache.cache_root()})", file=sys.stderr, flush=True)


def _compile(name: str, keys: Tuple[str, str, str], entry: Path, source: str, tc: Toolchain,
             timeout: float) -> BuildResult:
    """Compile into a work folder and publish it as `entry`; `keys`: the cache key, the
    content key and the ship key."""
    key, ckey, skey = keys
    _announce(name)
    t0 = time.perf_counter()
    module = f"opkit_{name}_{key[:12]}"
    work = cache.new_workdir(name, key)
    pyx, c_file = work / f"{module}.pyx", work / f"{module}.c"
    so = work / f"{module}{tc.ext_suffix}"
    report = work / "vectorize.txt"
    log: List[str] = []
    try:
        pyx.write_text(source)
        cy_cmd = [sys.executable, "-m", "cython", "-3", "--fast-fail", "-I", str(templates_dir()),
                  pyx.name, "-o", c_file.name]
        r = run_tool(cy_cmd, work, timeout)
        log += ["$ " + " ".join(cy_cmd), r.stdout, r.stderr]
        if r.returncode != 0:
            raise BuildError(_explain("Cython", r, source, None))
        cc_cmd = tc.compile_command(c_file.name, so.name, report.name,
                                    objects=objects_for(source, tc, timeout))
        r = run_tool(cc_cmd, work, timeout)
        log += ["$ " + " ".join(cc_cmd), r.stdout, r.stderr]
        if r.returncode != 0:
            raise BuildError(_explain(tc.cc[0], r, source, c_file.read_text(errors="replace")))
        if not so.is_file():
            raise BuildError(f"{tc.cc[0]} exited with status 0 but wrote no module {so.name} "
                             f"(CC={' '.join(tc.cc)})")
        if tc.family == "clang":
            report.write_text(r.stderr)
        seconds = time.perf_counter() - t0
        meta = {
            "name": name, "key": key, "module": module, "so": so.name, "pyx": pyx.name,
            "built": time.strftime("%Y-%m-%dT%H:%M:%S"), "seconds": round(seconds, 3),
            "toolchain": tc.key_material(), "target": tc.target.describe(),
            # the compiler-free identity, and the vector width this compiler chose (it annotates
            # the source): what a process without a compiler needs to find this module
            "content": {"key": ckey, "toolchain": tc.content_material(),
                        "vector_bytes": tc.target.vector_bytes,
                        "ship": skey},
            "files": {f.name: cache.file_record(f) for f in (so, pyx)},
            # a -march=native module may use any instruction of this CPU: where it is shipped,
            # it is loaded only on a CPU with every one of these flags
            "cpu_flags": list(cpu_flags()) if tc.target.isa == "native" else [],
            "vectorization": parse_report(report, pyx.name, c_file, source),
        }
        c_file.unlink()  # 10k lines of Cython boilerplate; the .pyx is the readable source
        (work / "build.log").write_text("\n".join(s for s in log if s))
        cache.write_json_atomic(work / "meta.json", meta)
        cache.publish(work, entry)
        return BuildResult(name, key, entry, module, False, seconds, meta)
    except BaseException:
        with contextlib.suppress(OSError):  # keep what there is for the failed-* folder
            if work.exists():
                (work / "build.log").write_text("\n".join(s for s in log if s))
                failed = cache.cache_root() / f"failed-{entry.name}"
                shutil.rmtree(failed, ignore_errors=True)
                os.replace(work, failed)
        raise


_ERR_LINE = re.compile(r"^(?P<file>[^:\s]+\.(?:pyx|c)):(?P<line>\d+):(?:(?P<col>\d+):)?\s*(?P<msg>.*)$")
_YAML_REF = re.compile(r"#\s*([^#:]+\.ya?ml):(\d+)\s*$")


def _explain(tool: str, result: subprocess.CompletedProcess, source: str, c_text: Optional[str]) -> str:
    """The first error, the generated line it is on and the declaration line behind it."""
    output = (result.stdout or "") + (result.stderr or "")
    status = f"exit status {result.returncode}"
    src_lines = source.splitlines()
    first = None
    for line in output.splitlines():
        m = _ERR_LINE.match(line.strip())
        if m and ("error" in m.group("msg").lower() or m.group("file").endswith(".pyx")):
            first = m
            break
    head = f"{tool} failed to compile the generated kernel module"
    log = "the full log is in the cache folder failed-*"
    if first is None:
        tail = "\n".join(output.strip().splitlines()[-15:])
        if not tail:
            return f"{head} ({status}) and printed nothing; {log}"
        return f"{head} ({status}):\n{tail}\n  ({log})"
    msg = first.group("msg")
    c_line = int(first.group("line"))
    pyx_line: Optional[int]
    if first.group("file").endswith(".pyx"):
        pyx_line = c_line
    else:
        of_c = pyx_lines(c_text or "", Path(first.group("file")).stem + ".pyx")
        pyx_line = of_c[c_line] if c_line < len(of_c) else None
    parts = [f"{head}: {msg}"]
    if pyx_line and 0 < pyx_line <= len(src_lines):
        text = src_lines[pyx_line - 1]
        parts.append(f"  generated line {pyx_line}: {text.strip()}")
        ref = _YAML_REF.search(text)
        if ref:
            parts.append(f"  which comes from {ref.group(1)}:{ref.group(2)}")
    parts.append(f"  ({tool}: {status}; {log}; `opkit show NAME` prints the source)")
    return "\n".join(parts)
