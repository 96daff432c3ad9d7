"""Random operator declarations over the whole expression language, and an independent
reference for them in PyTorch (float64, autograd).

An expression is a tree of tuples, drawn by the Hypothesis strategies below. `render` writes it
as declaration text; `Reference` evaluates the same tree with PyTorch's functions, so nothing of
opkit's parser, derivation or kernels is in the reference. Where docs/spec.md defines a result
that PyTorch's function does not give, the reference follows the documentation and says why
(`sign` of NaN is NaN, as NumPy's; the gradient flows only through the branch taken).

Inputs of one declaration: `x` and `z` (4-d, NCHW or NHWC, or layout-agnostic in the "nd"
family), `c` (per channel, `shape: [C]`), `s` (layout-agnostic, broadcast) and the optional `o`.
Attrs: `a` (float with a range), `lo` (`default: finfo.min`), `n` (`null_means`), `k` (int),
`b` (bool) and `m` (str with choices).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Dict, List

from hypothesis import strategies as st

# ------------------------------------------------------------------------------ the language

UNARY = ("abs", "ceil", "cos", "erf", "erfc", "exp", "expm1", "floor", "log", "log1p", "round",
         "sigmoid", "sign", "sin", "softplus", "sqrt", "tanh")
BINARY = ("max", "min", "maximum", "minimum")
ARITH = ("+", "-", "*", "/")
COMPARE = ("<", "<=", ">", ">=", "==", "!=")
CONSTANTS = (0, 1, 2, 0.5, -1, 3, -0.25, 1e-3, 100)
NAMED = ("pi", "e", "inf")
FINFO = ("max", "min", "eps", "tiny")
POWERS = (0, 1, 2, 3, -1, 0.5, -2)

ATTRS = {
    "a": "{type: float, default: 0.3, range: [-2.0, 2.0]}",
    "lo": "{type: float, default: finfo.min}",
    "n": "{type: float, default: null, null_means: 0.5}",
    "k": "{type: int, default: 2, range: [0, 4]}",
    "b": "{type: bool, default: false}",
    "m": "{type: str, choices: [p, q], default: p}",
}
NUMBER_ATTRS = ("a", "lo", "n", "k")


def inputs_of(family: str) -> Dict[str, str]:
    """The declared inputs of a family: "4d" (x and z in NCHW or NHWC, a per-channel c) or
    "nd" (layout-agnostic x and z, the same shape: calls take the direct path). float64 only:
    the comparison is in float64, and a module of one dtype compiles in half the time."""
    if family == "4d":
        return {"x": "{dtypes: [float64], layouts: [NCHW, NHWC]}",
                "z": "{dtypes: [float64], layouts: [NCHW, NHWC]}",
                "c": "{dtypes: [float64], shape: [C]}",
                "s": "{dtypes: [float64]}",
                "o": "{dtypes: [float64], layouts: [NCHW, NHWC], optional: true}"}
    return {"x": "{dtypes: [float64]}", "z": "{dtypes: [float64]}"}


# ------------------------------------------------------------------------------ strategies

def _leaf(family: str):
    names = ("x", "z", "c", "s") if family == "4d" else ("x", "z")
    return st.one_of(
        st.sampled_from(names).map(lambda n: ("in", n)),
        st.sampled_from(names[:2]).map(lambda n: ("in", n)),   # the full inputs more often
        st.sampled_from(NUMBER_ATTRS).map(lambda n: ("attr", n)),
        st.sampled_from(CONSTANTS).map(lambda v: ("const", v)),
        st.sampled_from(NAMED).map(lambda v: ("named", v)),
        st.sampled_from(FINFO).map(lambda v: ("finfo", v)))


@st.composite
def number(draw, family: str, depth: int = 3):
    """A number-valued expression tree at most `depth` calls deep."""
    if depth <= 0 or draw(st.integers(0, 3)) == 0:
        return draw(_leaf(family))
    d = depth - 1
    kind = draw(st.sampled_from(("arith", "arith", "unary", "unary", "neg", "binary", "clamp",
                                 "where", "pow", "powk", "str", "opt")))
    if kind == "arith":
        return ("arith", draw(st.sampled_from(ARITH)), draw(number(family, d)), draw(number(family, d)))
    if kind == "unary":
        return ("fn", draw(st.sampled_from(UNARY)), draw(number(family, d)))
    if kind == "neg":
        return ("neg", draw(number(family, d)))
    if kind == "binary":
        return ("fn2", draw(st.sampled_from(BINARY)), draw(number(family, d)), draw(number(family, d)))
    if kind == "clamp":
        return ("clamp", draw(number(family, d)), draw(number(family, d)), draw(number(family, d)))
    if kind == "where":
        return ("where", draw(st.sampled_from(("call", "ifelse"))), draw(condition(family, d)),
                draw(number(family, d)), draw(number(family, d)))
    if kind == "pow":
        return ("pow", draw(st.sampled_from(("call", "op"))), draw(number(family, d)),
                draw(number(family, d)))
    if kind == "powk":
        return ("powk", draw(number(family, d)), draw(st.sampled_from(POWERS)))
    if kind == "str":
        return ("str", draw(st.sampled_from(("==", "!="))), draw(st.sampled_from(("p", "q"))),
                draw(number(family, d)), draw(number(family, d)))
    if family != "4d":
        return draw(number(family, d))
    return ("opt", draw(number(family, d)))


@st.composite
def condition(draw, family: str, depth: int = 2):
    """A condition-valued tree."""
    kind = draw(st.sampled_from(("cmp", "cmp", "cmp", "chain", "logic", "not", "test", "battr",
                                 "bconst")))
    d = max(depth - 1, 0)
    if kind == "cmp" or (kind in ("logic", "not") and depth <= 0):
        return ("cmp", draw(st.sampled_from(COMPARE)), draw(number(family, d)), draw(number(family, d)))
    if kind == "chain":
        return ("chain", draw(st.sampled_from(COMPARE)), draw(st.sampled_from(COMPARE)),
                draw(number(family, d)), draw(number(family, d)), draw(number(family, d)))
    if kind == "logic":
        return ("logic", draw(st.sampled_from(("&", "|", "and", "or"))), draw(condition(family, d)),
                draw(condition(family, d)))
    if kind == "not":
        return ("not", draw(st.sampled_from(("~", "not"))), draw(condition(family, d)))
    if kind == "test":
        return ("test", draw(st.sampled_from(("isnan", "isinf"))), draw(number(family, d)))
    if kind == "battr":
        return ("battr",)
    return ("bconst", draw(st.booleans()))


# ------------------------------------------------------------------------------ declaration text

def render(t) -> str:
    """The expression, every operation in parentheses: the tree says the order, not precedence."""
    kind = t[0]
    if kind == "in" or kind == "attr":
        return t[1]
    if kind == "const":
        return repr(t[1])
    if kind == "named":
        return t[1]
    if kind == "finfo":
        return f"finfo.{t[1]}"
    if kind == "arith":
        return f"({render(t[2])} {t[1]} {render(t[3])})"
    if kind == "neg":
        return f"(-{render(t[1])})"
    if kind == "fn":
        return f"{t[1]}({render(t[2])})"
    if kind == "fn2":
        return f"{t[1]}({render(t[2])}, {render(t[3])})"
    if kind == "clamp":
        return f"clamp({render(t[1])}, {render(t[2])}, {render(t[3])})"
    if kind == "where":
        if t[1] == "call":
            return f"where({render(t[2])}, {render(t[3])}, {render(t[4])})"
        return f"({render(t[3])} if {render(t[2])} else {render(t[4])})"
    if kind == "pow":
        return f"pow({render(t[2])}, {render(t[3])})" if t[1] == "call" else \
            f"({render(t[2])} ** {render(t[3])})"
    if kind == "powk":
        return f"({render(t[1])} ** {t[2]!r})"
    if kind == "str":
        return f"({render(t[3])} if m {t[1]} \"{t[2]}\" else {render(t[4])})"
    if kind == "opt":
        return f"(o if is_given(o) else {render(t[1])})"
    if kind == "cmp":
        return f"({render(t[2])} {t[1]} {render(t[3])})"
    if kind == "chain":
        return f"({render(t[3])} {t[1]} {render(t[4])} {t[2]} {render(t[5])})"
    if kind == "logic":
        return f"({render(t[2])} {t[1]} {render(t[3])})"
    if kind == "not":
        return f"(~{render(t[2])})" if t[1] == "~" else f"(not {render(t[2])})"
    if kind == "test":
        return f"{t[1]}({render(t[2])})"
    if kind == "battr":
        return "b"
    if kind == "bconst":
        return repr(t[1])
    raise AssertionError(t)


def declaration(name: str, family: str, trees: List[tuple]) -> str:
    """An operator with one output per tree: `y0`, `y1` ..."""
    lines = [f"name: {name}", "inputs:"]
    lines += [f"  {k}: {v}" for k, v in inputs_of(family).items()]
    lines.append("attrs:")
    lines += [f"  {k}: {v}" for k, v in ATTRS.items()]
    lines.append("outputs:")
    lines += [f"  y{i}: {{}}" for i in range(len(trees))]
    lines.append("forward:")
    lines += [f"  y{i}: {json.dumps(render(t))}" for i, t in enumerate(trees)]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------ the reference

# functions whose results differ between implementations by an ulp or so (libm, SLEEF): the
# noisy evaluations perturb exactly these
ROUNDED = frozenset(("cos", "erf", "erfc", "exp", "expm1", "log", "log1p", "sigmoid", "sin",
                     "softplus", "tanh", "pow"))


@dataclass
class Call:
    """What one call binds: physical arrays as tensors, attr values, the compile-time choices."""

    values: Dict[str, object]          # input name -> float64 tensor (physical order)
    attrs: Dict[str, object]           # attr name -> number or bool (after defaults)
    m: str
    given_o: bool


class Reference:
    """The trees evaluated with PyTorch in float64. `noise` > 0: every ROUNDED function's result
    times (1 + noise * u), u uniform in [-1, 1) per element, drawn from `seed`: a stand-in for
    an implementation that rounds differently. An element whose result moves by much more than
    that is ill-conditioned there (a condition on a computed value flips, a cancellation
    follows), and comparisons leave it out."""

    def __init__(self, torch, call: Call, noise: float = 0.0, seed: int = 0):
        self.torch, self.call, self.noise, self.seed = torch, call, noise, seed

    def scalar(self, v):
        return self.torch.tensor(v, dtype=self.torch.float64)

    def _noisy(self, v, t):
        """The same perturbation each time node `t` is evaluated in the same shape."""
        if not self.noise:
            return v
        gen = self.torch.Generator().manual_seed(hash((self.seed, id(t))) & 0xFFFFFFFF)
        u = self.torch.rand(v.shape, generator=gen, dtype=self.torch.float64) * 2 - 1
        return v * (1 + self.noise * u)

    def number(self, t, env):
        torch = self.torch
        kind = t[0]
        if kind == "in":
            return env[t[1]]
        if kind == "attr":
            return self.scalar(float(self.call.attrs[t[1]]))
        if kind == "const":
            return self.scalar(float(t[1]))
        if kind == "named":
            return self.scalar({"pi": math.pi, "e": math.e, "inf": math.inf}[t[1]])
        if kind == "finfo":
            return self.scalar(float(getattr(__import__("numpy").finfo("float64"), t[1])))
        if kind == "arith":
            a, b = self.number(t[2], env), self.number(t[3], env)
            return {"+": torch.add, "-": torch.sub, "*": torch.mul, "/": torch.div}[t[1]](a, b)
        if kind == "neg":
            return -self.number(t[1], env)
        if kind == "fn":
            return self._unary(t, env)
        if kind == "fn2":
            return self._routed(t[1][:3], (t[2], t[3]), env)
        if kind == "clamp":
            return self._routed("clamp", (t[1], t[2], t[3]), env)
        if kind == "where":
            c = self.condition(t[2], env)
            a = self.number(t[3], _gate(torch, env, c))
            b = self.number(t[4], _gate(torch, env, ~c))
            return torch.where(c, a, b)
        if kind == "pow":
            return self._pow(t, t[2], t[3], env)
        if kind == "powk":
            return self._pow(t, t[1], ("const", t[2]), env)
        if kind == "str":
            holds = (self.call.m == t[2]) == (t[1] == "==")
            return self.number(t[3] if holds else t[4], env)
        if kind == "opt":
            return env["o"] if self.call.given_o else self.number(t[1], env)
        raise AssertionError(t)

    def _unary(self, t, env):
        torch = self.torch
        name, arg = t[1], t[2]
        if name in ("floor", "ceil", "round", "sign"):
            # documented gradient 0: nothing reaches the argument, not even 0 * inf
            v = self.number(arg, _gate(torch, env, None))
            if name == "sign":  # NaN stays NaN (NumPy's sign; PyTorch's gives 0)
                return torch.where(torch.isnan(v), v, torch.sign(v))
            return getattr(torch, name)(v)
        if name == "abs":  # no gradient at 0 and at NaN (PyTorch's abs)
            v = self.number(arg, env).detach()
            return torch.abs(self.number(arg, _gate(torch, env, (v != 0) & ~torch.isnan(v))))
        v = self.number(arg, env)
        fn = {"erf": torch.special.erf, "erfc": torch.special.erfc,
              "softplus": lambda u: torch.logaddexp(u, torch.zeros_like(u)),
              # PyTorch's log1p gives 0 at the smallest subnormals (5e-324); below 2^-54
              # log1p(u) rounds to u
              "log1p": lambda u: torch.where(u.abs() < 2.0 ** -54, u, torch.log1p(u))}.get(name)
        out = fn(v) if fn is not None else getattr(torch, name)(v)
        return self._noisy(out, t) if name in ROUNDED else out

    def _routed(self, name: str, args, env):
        """min, max, clamp: the gradient goes only to the arguments PyTorch's rule picks at each
        element (its own backward, asked with a cotangent of 1, says which)."""
        torch = self.torch
        fn = {"max": torch.maximum, "min": torch.minimum, "clamp": torch.clamp}[name]
        values = [self.number(a, env).detach() for a in args]
        # each argument in the broadcast shape: the rule's choice is per element, and autograd
        # cannot hand a 0-d argument of clamp its gradient of a larger result
        shape = torch.broadcast_shapes(*(v.shape for v in values))
        probe = [v.expand(shape).clone().requires_grad_() for v in values]
        out = fn(*probe)
        local = torch.autograd.grad(out, probe, torch.ones_like(out), allow_unused=True)
        gated = [self.number(a, _gate(torch, env, g.ne(0) if g is not None else None))
                 for a, g in zip(args, local)]
        return fn(*gated)

    def _pow(self, t, base, exponent, env):
        """pow: no gradient to the base where the exponent is 0, none to the exponent where the
        base is 0 and the exponent >= 0 (docs/spec.md; PyTorch's pow masks the same)."""
        torch = self.torch
        b, e = self.number(base, env).detach(), self.number(exponent, env).detach()
        bg = self.number(base, _gate(torch, env, e != 0))
        eg = self.number(exponent, _gate(torch, env, ~((b == 0) & (e >= 0))))
        return self._noisy(torch.pow(bg, eg), t)

    def condition(self, t, env):
        torch = self.torch
        kind = t[0]
        if kind == "cmp":
            return _COMPARE[t[1]](self.number(t[2], env), self.number(t[3], env))
        if kind == "chain":
            a, b, c = (self.number(u, env) for u in t[3:6])
            return _COMPARE[t[1]](a, b) & _COMPARE[t[2]](b, c)
        if kind == "logic":
            a, b = self.condition(t[2], env), self.condition(t[3], env)
            return (a & b) if t[1] in ("&", "and") else (a | b)
        if kind == "not":
            return ~self.condition(t[2], env)
        if kind == "test":
            v = self.number(t[2], env)
            return torch.isnan(v) if t[1] == "isnan" else torch.isinf(v)
        if kind == "battr":
            return torch.tensor(bool(self.call.attrs["b"]))
        if kind == "bconst":
            return torch.tensor(bool(t[1]))
        raise AssertionError(t)


_COMPARE = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
            ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b}


def _gate(torch, env, mask):
    """The inputs as a branch sees them: alive (differentiable) where `mask` holds, detached
    elsewhere (None: detached everywhere). A gradient the branch would send where it is not
    taken stops here, in a select, so even an infinite slope there leaves 0."""
    out = {}
    for name, t in env.items():
        if mask is None:
            out[name] = t.detach()
        else:
            out[name] = torch.where(mask, t, t.detach())
    return out


def evaluate(torch, trees, call: Call, dys=None, noise: float = 0.0, seed: int = 0):
    """(outputs, gradients): each tree's value broadcast to the call's shape, and with `dys`
    the gradient of sum(dy_i * y_i) for every input (None for one that takes none)."""
    ref = Reference(torch, call, noise, seed)
    leaves = {n: v.detach().clone().requires_grad_() for n, v in call.values.items()}
    shape = torch.broadcast_shapes(*(v.shape for v in leaves.values()))
    # every input in the call's shape first: the gradient is computed per element and then
    # summed to a broadcast input's shape (docs/spec.md), never summed first and then scaled
    # (inf * sum(dy) is not sum(inf * dy) when dy has both signs)
    full = {n: v.expand(shape) for n, v in leaves.items()}
    outs = [torch.broadcast_to(ref.number(t, full), shape) for t in trees]
    if dys is None:
        return [o.detach() for o in outs], None
    total = sum((o * dy).sum() for o, dy in zip(outs, dys) if o.requires_grad)
    names = list(leaves)
    if not isinstance(total, torch.Tensor) or not total.requires_grad:
        return [o.detach() for o in outs], {n: None for n in names}
    grads = torch.autograd.grad(total, [leaves[n] for n in names], allow_unused=True)
    return [o.detach() for o in outs], dict(zip(names, grads))
