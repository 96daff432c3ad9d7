"""Cython source → compiled extension module in the cache.

The cache key is a sha256 over the generated source, the templates, the declaration and the
toolchain (opkit, Cython, NumPy and Python versions, compiler, flags, CPU features). A failed
compile is reported with the generated line and the declaration line it came from.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from .._paths import templates_dir
from ..codegen import template_digest
from ..errors import BuildError
from . import cache
from .toolchain import Toolchain
from .vecreport import parse_report


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
        return cache.load_module(self.so_path, self.module_name)


def key_for(name: str, source: str, spec_canonical: dict, tc: Toolchain) -> str:
    return cache.cache_key({
        "name": name,
        "source": hashlib.sha256(source.encode()).hexdigest(),
        "templates": template_digest(),
        "spec": spec_canonical,
        "toolchain": tc.key_material(),
    })


def _hit(name: str, key: str, entry: Path) -> Optional[BuildResult]:
    meta = cache.read_meta(entry)
    if meta and (entry / meta.get("so", "\0")).is_file():
        return BuildResult(name, key, entry, meta["module"], True, 0.0, meta)
    return None


def build(name: str, source: str, spec_canonical: dict, tc: Toolchain, force: bool = False,
          env_timeout: float = 900.0) -> BuildResult:
    """Compile `source` (the module of operator `name`) unless the cache already has it."""
    key = key_for(name, source, spec_canonical, tc)
    entry = cache.entry_dir(name, key)
    if not force:
        hit = _hit(name, key, entry)
        if hit:
            return hit
    with cache.file_lock(cache.cache_root() / f".{entry.name}.lock"):
        if not force:
            hit = _hit(name, key, entry)  # another process finished it while we waited
            if hit:
                return hit
        return _compile(name, key, entry, source, tc, env_timeout)


def _run(cmd: List[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, cwd=str(cwd), capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise BuildError(f"cannot run {cmd[0]!r}: not found; install it or set CC") from None
    except subprocess.TimeoutExpired:
        raise BuildError(f"{cmd[0]} did not finish within {timeout:.0f} s") from None


def _compile(name: str, key: str, entry: Path, source: str, tc: Toolchain, timeout: float) -> BuildResult:
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
        r = _run(cy_cmd, work, timeout)
        log += ["$ " + " ".join(cy_cmd), r.stdout, r.stderr]
        if r.returncode != 0:
            raise BuildError(_explain("Cython", r.stdout + r.stderr, source, None, pyx.name))
        cc_cmd = tc.compile_command(c_file.name, so.name, report.name)
        r = _run(cc_cmd, work, timeout)
        log += ["$ " + " ".join(cc_cmd), r.stdout, r.stderr]
        if r.returncode != 0 or not so.is_file():
            c_text = c_file.read_text(errors="replace")
            raise BuildError(_explain(tc.cc[0], r.stdout + r.stderr, source, c_text, c_file.name))
        if tc.family == "clang":
            report.write_text(r.stderr)
        seconds = time.perf_counter() - t0
        meta = {
            "name": name, "key": key, "module": module, "so": so.name, "pyx": pyx.name,
            "built": time.strftime("%Y-%m-%dT%H:%M:%S"), "seconds": round(seconds, 3),
            "toolchain": tc.key_material(), "target": tc.target.describe(),
            "vectorization": parse_report(report, pyx.name, c_file, source),
        }
        c_file.unlink()  # 10k lines of Cython boilerplate; the .pyx is the readable source
        (work / "build.log").write_text("\n".join(s for s in log if s))
        cache.write_json_atomic(work / "meta.json", meta)
        cache.publish(work, entry)
        return BuildResult(name, key, entry, module, False, seconds, meta)
    except BaseException:
        (work / "build.log").write_text("\n".join(s for s in log if s)) if work.exists() else None
        failed = cache.cache_root() / f"failed-{entry.name}"
        shutil.rmtree(failed, ignore_errors=True)
        if work.exists():
            os.replace(work, failed)
        raise


_PYX_MARK = re.compile(r'^\s*/\* "(?P<file>[^"]+\.pyx)":(?P<line>\d+)')
_ERR_LINE = re.compile(r"^(?P<file>[^:\s]+\.(?:pyx|c)):(?P<line>\d+):(?:(?P<col>\d+):)?\s*(?P<msg>.*)$")
_YAML_REF = re.compile(r"#\s*([^#:]+\.ya?ml):(\d+)\s*$")


def _pyx_line_of_c(c_text: str, c_line: int) -> Optional[int]:
    lines = c_text.splitlines()
    for i in range(min(c_line, len(lines)) - 1, -1, -1):
        m = _PYX_MARK.match(lines[i])
        if m:
            return int(m.group("line"))
    return None


def _explain(tool: str, output: str, source: str, c_text: Optional[str], file_name: str) -> str:
    """The first error, the generated line it is on and the declaration line behind it."""
    src_lines = source.splitlines()
    first = None
    for line in output.splitlines():
        m = _ERR_LINE.match(line.strip())
        if m and ("error" in m.group("msg").lower() or m.group("file").endswith(".pyx")):
            first = m
            break
    parts = [f"{tool} failed to compile the generated kernel module"]
    if first is None:
        tail = "\n".join(output.strip().splitlines()[-15:])
        return parts[0] + ":\n" + tail
    msg = first.group("msg")
    pyx_line = int(first.group("line")) if first.group("file").endswith(".pyx") else (
        _pyx_line_of_c(c_text or "", int(first.group("line"))))
    parts[0] += f": {msg}"
    if pyx_line and 0 < pyx_line <= len(src_lines):
        text = src_lines[pyx_line - 1]
        parts.append(f"  generated line {pyx_line}: {text.strip()}")
        ref = _YAML_REF.search(text)
        if ref:
            parts.append(f"  which comes from {ref.group(1)}:{ref.group(2)}")
    parts.append("  (the full log is in the cache folder failed-*; `opkit show NAME` prints the source)")
    return "\n".join(parts)
