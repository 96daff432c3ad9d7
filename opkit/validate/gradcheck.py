"""Central finite differences of the compiled float64 forward against the compiled backward,
away from every kink."""
from __future__ import annotations

import math
from typing import List

import numpy as np

from ..runtime.bind import bind
from .cases import Case, smooth
from .reference import evaluate
from .report import Check


def gradcheck(op, cases: List[Case], attrs, rng, notes: List[str], graphs=None,
              h: float = 1e-6, tol: float = 1e-6) -> Check:
    """Central differences of the compiled float64 forward against the compiled backward, at
    ordinary points (no zeros, infinities or NaN) where the forward result is finite.
    `graphs`: those of the variant the cases and attrs call (the first by default)."""
    spec, graphs = op.spec, graphs or op.graphs
    worst, count, where = 0.0, 0, ""
    base_attrs = attrs
    for case in cases:
        attrs = {**base_attrs, **case.attrs}
        contiguous = not any(case.views.values())
        if not contiguous or min((v.size for v in case.arrays.values()), default=0) == 0:
            continue
        base = smooth(case, spec, rng).arrays
        if not all(np.isfinite(t).all() for t in _outputs(op(**base, **attrs, layout=case.layout))):
            notes.append(f"gradcheck skipped {case.label}: the forward result is not finite there")
            continue
        for _ in range(5):
            dirs = {k: rng.standard_normal(np.shape(v)) for k, v in base.items()
                    if k in graphs.differentiable}
            if not _stable(op, graphs, base, dirs, attrs, case.layout, h):
                base = {k: v + rng.uniform(-1e-3, 1e-3, np.shape(v)) for k, v in base.items()}
                continue
            ys = _outputs(op(**base, **attrs, layout=case.layout))
            dys = tuple(rng.standard_normal(np.shape(t)) for t in ys)
            grads = op.backward(dys if len(dys) > 1 else dys[0], **base, **attrs, layout=case.layout)
            for name, g in zip(spec.input_names, grads):
                if name not in dirs:
                    continue

                def loss(sign: float):
                    moved = dict(base)
                    moved[name] = base[name] + sign * h * dirs[name]
                    outs = _outputs(op(**moved, **attrs, layout=case.layout))
                    terms = [d * o for d, o in zip(dys, outs)]
                    return (math.fsum(float(np.sum(t)) for t in terms),
                            math.fsum(float(np.sum(np.abs(t))) for t in terms))

                (up, mag), (down, _) = loss(1.0), loss(-1.0)
                fd = (up - down) / (2 * h)
                an = float(np.sum(g * dirs[name]))
                label = f"{case.label} d{name}: finite difference {fd!r}, backward {an!r}"
                count += 1
                if not (math.isfinite(fd) and math.isfinite(an)):
                    # the forward is finite here, so is its derivative: NaN or inf is a failure
                    worst, where = math.inf, label
                    continue
                # the difference quotient carries rounding noise of about eps * sum|terms| / h
                noise = 10 * np.finfo(np.float64).eps * mag / h
                scale = max(abs(fd), abs(an)) + noise / tol
                err = abs(fd - an) / scale if scale else 0.0  # 0 / 0: both are exactly 0
                if err > worst:
                    worst, where = err, label
            break
        else:
            notes.append(f"gradcheck skipped {case.label}: every direction crossed a kink")
    return Check("gradcheck float64", count, worst / tol, worst, None, worst <= tol, where)


def _outputs(result) -> tuple:
    return result if isinstance(result, tuple) else (result,)


def _stable(op, graphs, base, dirs, attrs, layout, h) -> bool:
    """No kink between x - h*v and x + h*v: no branch condition of the forward graph (a where's
    condition, which argument min or max picks, the sign abs sees ...) changes."""
    spec = op.spec
    masks = []
    for sign in (-1.0, 1.0):
        moved = {k: (v + sign * h * dirs[k]) if k in dirs else v for k, v in base.items()}
        m: List[np.ndarray] = []
        bound = bind(spec, {**moved, **attrs}, layout, spec.name)
        evaluate(graphs.forward, bound.values, bound.attrs, masks=m)
        masks.append(m)
    return all(np.array_equal(a, b) for a, b in zip(*masks))
