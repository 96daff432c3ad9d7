"""The differential fuzz tier: random declarations over the whole expression language, built and
compared with PyTorch in float64, forward and backward.

Each example is one operator with one output per random expression (`tests/fuzz_dsl.py` draws
them over every function, operator, comparison, `a if c else b`, `& | ~` and `and or not`, the
attrs of every kind, the optional input and per-channel and broadcast inputs, in NCHW and NHWC
or layout-agnostic), called on edge values (±0, ±inf, NaN, subnormals, ties of the inputs,
values at kinks) in two size classes, one of them with strided views, with warnings as errors.
PyTorch's autograd, with the documented rules where they are not PyTorch's (`fuzz_dsl.py` says
which), is the reference; an element is compared wherever the reference is well-conditioned.

OPKIT_FUZZ picks the profile: `ci` (the default: a fixed seed, a few examples, about two
minutes) or `long` (OPKIT_FUZZ_EXAMPLES examples, default 200, with shrinking):

    OPKIT_FUZZ=long pytest tests/test_fuzz_declarations.py
"""
import hashlib
import os
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import opkit  # noqa: E402

import fuzz_dsl  # noqa: E402
from fuzz_dsl import Call, declaration, evaluate, number  # noqa: E402

EXPRESSIONS = 12          # outputs per operator: one kernel per pass computes them all
LONG = os.environ.get("OPKIT_FUZZ", "ci") == "long"
EXAMPLES = int(os.environ.get("OPKIT_FUZZ_EXAMPLES", "200")) if LONG else 6
# two thirds of the declarations over N, C, H, W (per-channel, 0-d and optional inputs,
# layouts), a third over plain arrays; one test each, so the two run on both cores
EXAMPLES_4D, EXAMPLES_ND = EXAMPLES - EXAMPLES // 3, max(EXAMPLES // 3, 1)
NOISE = 1e-10             # the reference's stand-in for rounding differently (fuzz_dsl.Reference)
ILL = 1e-7                # a result moved by more than this (relative) by NOISE is ill-conditioned

SPECIAL = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 0.3, np.inf, -np.inf, np.nan,
                    5e-324, -1e-310, 1e300, -3.0, 100.0])
SHAPES = {"small": (2, 3, 2, 3), "large": (2, 5, 9, 13)}  # N, C, H, W; large: past a tile


@st.composite
def operators(draw, family):
    trees = draw(st.lists(number(family), min_size=EXPRESSIONS, max_size=EXPRESSIONS))
    return family, trees


@st.composite
def calls(draw, family):
    attrs = {}
    if draw(st.booleans()):
        attrs["a"] = draw(st.sampled_from((-2.0, -0.5, 0.0, 0.3, 1.0, 2.0)) | st.floats(-2, 2))
    if draw(st.booleans()):
        attrs["lo"] = draw(st.sampled_from((-1.0, 0.0, 0.5)))
    n = draw(st.sampled_from(("omit", None, -1.5, 0.0, 2.0)))
    if n != "omit":
        attrs["n"] = n
    if draw(st.booleans()):
        attrs["k"] = draw(st.integers(0, 4))
    if draw(st.booleans()):
        attrs["b"] = draw(st.booleans())
    if draw(st.booleans()):
        attrs["m"] = draw(st.sampled_from(("p", "q")))
    return {"attrs": attrs, "layout": draw(st.sampled_from(("NCHW", "NHWC"))),
            "given_o": family == "4d" and draw(st.booleans()), "seed": draw(st.integers(0, 2 ** 31)),
            "views": draw(st.sampled_from(("contiguous", "reversed", "transposed")))}


def _resolved(attrs):
    """The attrs as the documentation says a call takes them (defaults, null_means)."""
    out = {"a": 0.3, "lo": float(np.finfo(np.float64).min), "n": 0.5, "k": 2, "b": False}
    out.update({k: v for k, v in attrs.items() if k != "m"})
    if out["n"] is None:
        out["n"] = 0.5
    return out


def _values(rng, shape):
    """Edge values and ordinary ones, mixed; the same pool for every input, so ties occur."""
    ordinary = rng.standard_normal(shape) * 2
    special = SPECIAL[rng.integers(0, len(SPECIAL), shape)]
    return np.where(rng.random(shape) < 0.35, special, ordinary)


def _view(arr, how: str, rng):
    """The same values as a strided view: reversed along an axis, or in another memory order."""
    if how == "contiguous" or arr.ndim == 0:
        return arr
    if how == "reversed":
        axis = int(rng.integers(0, arr.ndim))
        return np.flip(np.flip(arr, axis).copy(), axis)
    perm = rng.permutation(arr.ndim)
    return np.ascontiguousarray(arr.transpose(perm)).transpose(np.argsort(perm))


def _arrays(family, size, call, rng):
    n, c, h, w = SHAPES[size]
    if family == "nd":
        shape = (n * c, h * w)
        return {"x": _values(rng, shape), "z": _values(rng, shape)}, {}
    phys = (n, c, h, w) if call["layout"] == "NCHW" else (n, h, w, c)
    values = {"x": _values(rng, phys), "z": _values(rng, phys), "c": _values(rng, (c,)),
              "s": _values(rng, ())}
    if call["given_o"]:
        values["o"] = _values(rng, phys)
    # the reference broadcasts the per-channel input along the layout's channel axis
    along = {"c": (1, c, 1, 1) if call["layout"] == "NCHW" else (1, 1, 1, c)}
    return values, along


def _reference(trees, arrays, along, call, dys, noise=0.0, seed=0):
    tensors = {k: torch.from_numpy(np.ascontiguousarray(v).reshape(along.get(k, v.shape)))
               for k, v in arrays.items()}
    ref = Call(tensors, _resolved(call["attrs"]), call["attrs"].get("m", "p"), call["given_o"])
    return evaluate(torch, trees, ref, dys, noise, seed)


def _check(got, want, noisy, what, report):
    """`got` (opkit) against `want` (the reference) where the noisy references agree with it."""
    want = np.asarray(want, dtype=np.float64)
    got = np.asarray(got, dtype=np.float64).reshape(want.shape) if got is not None else np.zeros_like(want)
    with np.errstate(invalid="ignore", over="ignore"):
        spread = np.zeros(want.shape)
        ill = np.zeros(want.shape, dtype=bool)
        for n in noisy:
            n = np.asarray(n, dtype=np.float64)
            same = (n == want) | (np.isnan(n) & np.isnan(want))
            d = np.where(same, 0.0, np.abs(n - want))
            ill |= ~same & ~(d <= ILL * np.abs(want))
            spread = np.maximum(spread, np.where(np.isfinite(d), d, 0.0))
        ok = ~ill
        nan_bad = ok & (np.isnan(got) != np.isnan(want))
        inf = ok & (np.isinf(want) | np.isinf(got)) & ~np.isnan(want)
        inf_bad = inf & (got != want)
        fin = ok & np.isfinite(want) & np.isfinite(got)
        err_bad = fin & ~(np.abs(got - want) <= 1e-11 * np.abs(want) + 1e3 * spread + 1e-290)
    bad = nan_bad | inf_bad | err_bad
    report["compared"] += int(ok.sum())
    report["skipped"] += int(ill.sum())
    if bad.any():
        i = tuple(int(k) for k in np.argwhere(bad)[0])
        return f"{what} at {i}: opkit {got[i]!r}, PyTorch {want[i]!r}"
    return None


REPORT = {"declarations": 0, "calls": 0, "compared": 0, "skipped": 0}


@pytest.fixture(scope="module", autouse=True)
def _summary():
    yield
    print(f"\nfuzz tier: {REPORT['declarations']} declarations x {EXPRESSIONS} expressions, "
          f"{REPORT['calls']} calls, {REPORT['compared']} elements compared, "
          f"{REPORT['skipped']} left out as ill-conditioned")


def fuzz_settings(examples):
    return settings(max_examples=examples, deadline=None, derandomize=not LONG, database=None,
                    phases=list(Phase) if LONG else [Phase.explicit, Phase.generate],
                    suppress_health_check=list(HealthCheck), print_blob=True)


@fuzz_settings(EXAMPLES_4D)
@pytest.mark.slow
@given(case=operators("4d"), data=st.data())
def test_random_4d_declarations_match_pytorch(case, data, tmp_path_factory):
    check_declaration(case, data, tmp_path_factory)


@fuzz_settings(EXAMPLES_ND)
@pytest.mark.slow
@given(case=operators("nd"), data=st.data())
def test_random_nd_declarations_match_pytorch(case, data, tmp_path_factory):
    check_declaration(case, data, tmp_path_factory)


def check_declaration(case, data, tmp_path_factory):
    """One random operator built, called on two sizes (drawn attrs, layout, views) and compared
    with PyTorch forward and backward."""
    family, trees = case
    text = declaration("fuzz", family, trees)
    name = "fuzz_" + hashlib.sha256(text.encode()).hexdigest()[:12]
    text = text.replace("name: fuzz", f"name: {name}", 1)
    note(text)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning may leak, from building or from a call
        if name not in opkit.list_ops():  # (Hypothesis runs a failing example again)
            folder = tmp_path_factory.mktemp("fuzz")
            (folder / f"{name}.yaml").write_text(text)
            opkit.load(str(folder))
        op = opkit.get(name)
        REPORT["declarations"] += 1
        for size in SHAPES:
            call = data.draw(calls(family), label=f"call ({size})")
            rng = np.random.default_rng(call["seed"])
            arrays, along = _arrays(family, size, call, rng)
            args = [_view(arrays[k], call["views"], rng) for k in ("x", "z")]
            kw = dict(call["attrs"])
            if family == "4d":
                args += [arrays["c"], arrays["s"], arrays.get("o")]
                kw["layout"] = call["layout"]
            outs = op(*args, **kw)
            dys = [rng.standard_normal(np.shape(o)) for o in outs]
            grads = op.backward(tuple(dys), *args, **kw)
            REPORT["calls"] += 1
            want, want_grads = _reference(trees, arrays, along, call,
                                          [torch.from_numpy(d) for d in dys])
            noisy = [_reference(trees, arrays, along, call, [torch.from_numpy(d) for d in dys],
                                NOISE, seed) for seed in (1, 2)]
            problems = []
            for i, (o, w) in enumerate(zip(outs, want)):
                problems.append(_check(o, w, [n[0][i] for n in noisy],
                                       f"y{i} = {fuzz_dsl.render(trees[i])}", REPORT))
            names = list(arrays)
            for k, g in zip([n for n in ("x", "z", "c", "s", "o") if n in names or n == "o"], grads):
                if k not in names:
                    assert g is None, f"a gradient for the input {k} the call left out"
                    continue
                w = want_grads[k]
                shape = arrays[k].shape
                w = np.zeros(shape) if w is None else w.reshape(shape).numpy()
                nz = [np.zeros(shape) if n[1][k] is None else n[1][k].reshape(shape).numpy()
                      for n in noisy]
                problems.append(_check(g, w, nz, f"d{k}", REPORT))
            problems = [p for p in problems if p]
            if problems and any(p.startswith("d") for p in problems):
                problems += _blame(op, trees, args, kw, arrays, along, call, dys)
            assert not problems, (f"{size} call {call}:\n  " + "\n  ".join(problems)
                                  + f"\ndeclaration:\n{text}")


def _blame(op, trees, args, kw, arrays, along, call, dys):
    """Which expressions a wrong gradient comes from: each output's gradient alone."""
    found = []
    for i in range(len(trees)):
        alone = [d if j == i else np.zeros_like(d) for j, d in enumerate(dys)]
        grads = op.backward(tuple(alone), *args, **kw)
        _, want = _reference(trees, arrays, along, call, [torch.from_numpy(d) for d in alone])
        for k, g in zip(arrays, grads):
            w = want[k]
            w = np.zeros(arrays[k].shape) if w is None else w.reshape(arrays[k].shape).numpy()
            problem = _check(g, w, [w], f"d{k}", {"compared": 0, "skipped": 0})
            if problem:
                found.append(f"from y{i} = {fuzz_dsl.render(trees[i])} alone: {problem}")
    return found
