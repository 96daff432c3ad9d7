"""The compiler's vectorization report, mapped back to each kernel's element loop."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, List, Optional

_TILE_DEF = re.compile(r"^cdef inline void (?P<name>\w+)_tile\(")
_LOOP = re.compile(r"^\s+for j in range\(n\):")
_GCC = re.compile(r"^(?P<file>[^:]+\.c):(?P<line>\d+):\d+: (?P<kind>optimized|missed|note): (?P<msg>.*)$")
_WIDTH = re.compile(r"using (\d+) byte vectors")
_CLANG = re.compile(r"^(?P<file>[^:]+\.c):(?P<line>\d+):\d+: remark: (?P<msg>.*)$")
_CLANG_WIDTH = re.compile(r"vectorization width: (\d+)")


def tile_loops(source: str) -> Dict[int, str]:
    """pyx line of each kernel instance's element loop -> instance name (fwd0_f ...)."""
    loops: Dict[int, str] = {}
    current: Optional[str] = None
    for i, line in enumerate(source.splitlines(), 1):
        m = _TILE_DEF.match(line)
        if m:
            current = m.group("name")
        elif current and _LOOP.match(line):
            loops[i] = current
            current = None
    return loops


def pyx_lines(c_text: str, pyx_name: str) -> List[Optional[int]]:
    """For each C line (1-based), the line of `pyx_name` Cython says it comes from (or None):
    the one map from compiled C back to the generated source, for compile errors and for the
    vectorization report."""
    mark = re.compile(r'^\s*/\* "%s":(\d+)' % re.escape(pyx_name))
    out: List[Optional[int]] = [None]
    current = None
    for line in c_text.splitlines():
        m = mark.match(line)
        if m:
            current = int(m.group(1))
        out.append(current)
    return out


def parse_report(report: Path, pyx_name: str, c_file: Path, source: str) -> Dict[str, dict]:
    """{instance: {"vectorized": bool, "bytes": widest vector, "notes": [...]}} per element loop."""
    loops = tile_loops(source)
    result: Dict[str, Dict[str, Any]] = {name: {"vectorized": False, "bytes": 0, "notes": []}
                                         for name in loops.values()}
    try:
        text = report.read_text(errors="replace")
        c_text = c_file.read_text(errors="replace")
    except OSError:
        for r in result.values():
            r["notes"].append("no vectorization report (the compiler does not write one)")
        return result
    pyx_of = pyx_lines(c_text, pyx_name)
    for line in text.splitlines():
        m = _GCC.match(line) or _CLANG.match(line)
        if not m:
            continue
        c_line = int(m.group("line"))
        pyx_line = pyx_of[c_line] if c_line < len(pyx_of) else None
        name = loops.get(pyx_line) if pyx_line else None
        if name is None:
            continue
        msg = m.group("msg")
        width = _WIDTH.search(msg) or _CLANG_WIDTH.search(msg)
        if ("loop vectorized" in msg or "vectorized loop" in msg) and width:
            result[name]["vectorized"] = True
            nbytes = int(width.group(1))
            if _CLANG_WIDTH.search(msg):
                nbytes *= 4  # clang reports lanes
            result[name]["bytes"] = max(result[name]["bytes"], nbytes)
        elif m.groupdict().get("kind") == "missed" and "not vectorized" in msg:
            note = msg.strip()
            if note not in result[name]["notes"]:
                result[name]["notes"].append(note)
    return result
