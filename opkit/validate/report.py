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
        if not self.ok:
            bad = next(c for c in self.checks if not c.passed)
            return f"FAIL {bad.what}: {bad.detail}"
        ulps = {}
        for c in self.checks:
            if c.what.startswith("forward") and c.max_ulp is not None:
                dt = c.what.split()[1]  # "forward float32" (and a variant's label after it)
                ulps[dt] = max(ulps.get(dt, 0), c.max_ulp)
        grad = [c for c in self.checks if c.what.startswith("gradcheck")]
        parts = [f"{dt.replace('float', 'f')} {u} ulp" for dt, u in ulps.items()]
        if not ulps:
            worst = max((c.worst for c in self.checks if c.what.startswith("forward")), default=0)
            parts.append(f"within {worst:.2g} of the allowed error")
        if grad:
            parts.append(f"grad rel err {max(g.max_abs for g in grad):.1e}")
        return "pass (" + ", ".join(parts) + ")"

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
