"""The function table of docs/spec.md, generated from the primitive records: one place says what
a function means and what its gradient is (`python -m opkit.dsl.reference_table` prints it; a
test keeps the page equal to it)."""
from __future__ import annotations

from typing import List

from .primitives import PRIMITIVES

BEGIN = "<!-- the function table: generated from opkit/dsl/primitives.py -->"
END = "<!-- end of the generated function table -->"


def _call(p) -> str:
    names = "xyz" if p.name != "where" else "cxy"
    if p.name == "clamp":
        names = ("x", "lo", "hi")
    if p.name == "pow":
        names = ("x", "e")
    return f"`{p.function}({', '.join(names[:len(p.arg_kinds)])})`"


def function_table() -> str:
    """The markdown table of the elementwise functions, in alphabetical order."""
    rows: List[str] = ["| function | meaning | gradient |", "| --- | --- | --- |"]
    for p in sorted((p for p in PRIMITIVES.values() if p.function), key=lambda p: p.function):
        call = _call(p)
        if p.function in ("min", "max"):
            call += f" (also `{p.function}imum`)"
        rows.append(f"| {call} | {p.doc} | {p.grad_doc or '-'} |")
    return "\n".join(rows)


def section() -> str:
    return f"{BEGIN}\n{function_table()}\n{END}"


if __name__ == "__main__":  # pragma: no cover
    print(section())
