"""What validation found: one `Check` per pass and dtype, gathered in a `Report`."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import List, Optional


@dataclass
class Check:
    what: str                 # e.g. "forward float16"
    cases: int
    worst: float
    max_abs: float
    max_ulp: Optional[int]
    passed: bool
    detail: str = ""


@dataclass
class Report:
    op: str
    checks: List[Check] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.passed for c in self.checks)

    def summary(self) -> str:
        """`pass (f32 fwd 2 ulp, bwd 0.031 of tol; ...)`: per dtype, each pass's largest error
        as a fraction of the dtype's standard (tol, docs/precision.md), or for an elementwise
        forward its largest ULP distance; then the gradient check."""
        if not self.ok:
            bad = next(c for c in self.checks if not c.passed)
            return f"FAIL {bad.what}: {bad.detail}"
        found: dict = {}
        for c in self.checks:
            kind, dt = c.what.split()[:2]  # "forward float32" (and a variant's label after it)
            if kind in ("forward", "backward"):
                found.setdefault(dt, {}).setdefault(kind, []).append(c)
        parts = []
        for dt, kinds in found.items():
            said = [f"{_SHORT[kind]} {_measure(checks)}" for kind, checks in kinds.items()]
            parts.append(f"{dt.replace('float', 'f')} {', '.join(said)}")
        grad = [c for c in self.checks if c.what.startswith("gradcheck")]
        if grad:
            parts.append(f"grad rel err {max(g.max_abs for g in grad):.1e}")
        return "pass (" + "; ".join(parts) + ")"

    def to_dict(self) -> dict:
        return {"op": self.op, "ok": self.ok, "summary": self.summary(),
                "checks": [asdict(c) for c in self.checks], "notes": self.notes}

    def format(self) -> str:
        rows = [f"{self.op}: {self.summary()}"]
        for c in self.checks:
            ulp = "-" if c.max_ulp is None else str(c.max_ulp)
            rows.append(f"  {c.what:<22} {c.cases:>3} cases  worst {c.worst:8.3g} of allowed  "
                        f"max |err| {c.max_abs:9.3g}  max ulp {ulp:>4}  {'ok' if c.passed else 'FAIL'}"
                        + ("" if c.passed else f"  {c.detail}"))
        rows += [f"  note: {n}" for n in self.notes]
        return "\n".join(rows)


_SHORT = {"forward": "fwd", "backward": "bwd"}


def _measure(checks: List[Check]) -> str:
    """"exact", "2 ulp" (where every check measured ULPs) or "0.031 of tol"."""
    worst = max(c.worst for c in checks)
    if worst == 0:
        return "exact"
    ulps = [c.max_ulp for c in checks if c.max_ulp is not None]
    if len(ulps) == len(checks):
        return f"{max(ulps)} ulp"
    return f"{worst:.2g} of tol"
