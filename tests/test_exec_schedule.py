"""The execution schedule (opkit/runtime/schedule.py): a pure function of the plan's facts, the
arrays' layouts and the settings, cached per layout by the executor, carried out as it says, and
printed by `opkit show NAME --shape ...`. Nothing here compiles a kernel."""
from pathlib import Path

import numpy as np
import pytest

import opkit
from opkit.cli import main
from opkit.kinds import Pass
from opkit.runtime import execute, schedule
from opkit.runtime.schedule import ArrayLayout, Settings, execution_schedule

REDUCTIONS = Path(__file__).resolve().parents[1] / "examples" / "reductions"
GAN_NAME = "freq_leaky_relu"


@pytest.fixture(scope="module")
def reductions():
    opkit.load(REDUCTIONS)
    return {name: opkit.get(name) for name in ("softmax", "layer_norm")}


def _facts(op, kind=Pass.FORWARD):
    fwd, bwd = op._run_plans()
    return (fwd if kind is Pass.FORWARD else bwd).facts


def _rows(n, k, itemsize=4):
    """A C-ordered [n, k] array's layout named (N, K)."""
    return ArrayLayout((n, k), ("N", "K"), (k * itemsize, itemsize), n * k * itemsize)


def test_a_plan_without_reductions_or_resampling_always_runs_whole():
    facts = _facts(opkit.get("leaky_relu"))
    assert not facts.may_slice
    x = ArrayLayout((1 << 26,), ("@0",), (4,), 1 << 28)
    sched = execution_schedule(facts, [x], {facts.outputs[0]: x}, {"@0": 1 << 26}, Settings(2))
    assert sched.slices is None and sched.why == schedule.WHOLE


@pytest.mark.parametrize("threads", [1, 2, 8])
def test_rows_slice_from_four_slices_of_their_size_whatever_the_threads(reductions, threads):
    """Below 4 * ROW_SLICE_BYTES a softmax runs whole; from there in slices of about
    ROW_SLICE_BYTES along N, one after another: the same slices on any number of threads, so
    results do not depend on it."""
    facts = _facts(reductions["softmax"])
    unit = Settings(threads).row_slice_bytes
    y = facts.outputs[0]
    for n, k, sliced in [(64, 1024, False), (4 * unit // 4096 - 1, 1024, False),
                         (4 * unit // 4096, 1024, True), (4096, 4096, True)]:
        x = _rows(n, k)
        sched = execution_schedule(facts, [x], {y: x}, {"N": n, "K": k}, Settings(threads))
        assert (sched.slices is not None) == sliced, (n, k, sched.why)
        if sliced:
            s = sched.slices
            assert s.dim == "N" and s.threads == 0 and s.partial == ()
            assert s.length * k * 4 <= 2 * unit and s.count == -(-n // s.length)
            assert s.length * (s.count - 1) < n <= s.length * s.count


def test_a_clipped_backward_with_a_sum_across_slices_runs_whole(reductions):
    """layer_norm's backward adds dweight and dbias up across slices: unclipped it slices with
    those partial; clipped it cannot (a clip per slice is not the clip of the sum)."""
    op = reductions["layer_norm"]   # the variant given weight and bias
    facts = next(f for f in (op._run_plans(v)[1].facts for v in op.variants)
                 if len(f.outputs) == 3)
    n, h, w, c = 16, 128, 128, 64
    x = ArrayLayout((n, h, w, c), ("N", "H", "W", "C"), (h * w * c * 4, w * c * 4, c * 4, 4),
                    n * h * w * c * 4)
    vec = ArrayLayout((c,), ("C",), (4,), c * 4)
    outs = {v: (vec if str(v) in ("dweight", "dbias") else x) for v in facts.outputs}
    sizes = {"N": n, "H": h, "W": w, "C": c}
    free = execution_schedule(facts, [x, x, vec, vec], outs, sizes, Settings(2))
    assert free.slices is not None and free.slices.dim == "N"
    assert sorted(map(str, free.slices.partial)) == ["dbias", "dweight"]
    clipped = execution_schedule(facts, [x, x, vec, vec], outs, sizes, Settings(2, clip=True))
    assert clipped.slices is None and "clipped" in clipped.why


def test_resampling_slices_one_per_thread():
    facts = _facts(opkit.get(GAN_NAME))
    assert facts.batch_dims == ("N", "C")
    x = ArrayLayout((8, 64, 64, 64), ("N", "C", "H", "W"), (1 << 20, 1 << 14, 256, 4), 8 << 20)
    outs = {v: x for v in facts.outputs}
    sizes = {"N": 8, "C": 64, "H": 64, "W": 64}
    for threads in (1, 2):   # 1 MiB of input a slice, as many at once as threads
        s = execution_schedule(facts, [x], outs, sizes, Settings(threads)).slices
        assert s is not None and (s.dim, s.length, s.count, s.threads) == ("N", 1, 8, threads)
    small = ArrayLayout((1, 4, 8, 8), ("N", "C", "H", "W"), (1024, 256, 32, 4), 1024)
    assert execution_schedule(facts, [small], {v: small for v in facts.outputs},
                              {"N": 1, "C": 4, "H": 8, "W": 8}, Settings(2)).slices is None


def test_the_executor_carries_out_the_schedule_it_caches_per_layout(reductions, monkeypatch):
    """What `Op.schedules` reports is what a call does: the executor runs the slices the
    schedule names (spied), and finds the schedule once per layout and settings."""
    op = reductions["softmax"]
    monkeypatch.setattr(schedule, "ROW_SLICE_BYTES", 1024)
    x = np.zeros((64, 256), np.float32)
    sched = op.schedules(x)
    assert set(sched) == {Pass.FORWARD, Pass.BACKWARD}
    s = sched[Pass.FORWARD].slices
    assert s is not None and (s.dim, s.length) == ("N", 1)
    ran = []
    monkeypatch.setattr(execute.Executor, "_run_sliced",
                        lambda self, d, step, threads, *a, **k: ran.append((d, step, threads)))
    monkeypatch.setattr(execute.Executor, "_run_whole", lambda *a, **k: ran.append("whole"))
    fwd = op._run_plans()[0]
    bound = op._prepare((x,), {}, None, None, "softmax()")
    like = op._like(bound)
    fwd.run(bound, None, {}, {v: bound.dtype for v in like}, like)
    assert ran == [(s.dim, s.length, s.threads)]
    assert fwd.schedule(bound, like) is fwd.schedule(bound, like)
    monkeypatch.setattr(schedule, "ROW_SLICE_BYTES", 4 << 20)   # a setting: a schedule of its own
    assert fwd.schedule(bound, like).slices is None


def test_show_prints_the_schedule_for_given_shapes(capsys):
    assert main(["show", "--path", str(REDUCTIONS), "softmax", "--shape", "x=4096,4096"]) == 0
    out = capsys.readouterr().out
    assert "forward: runs in 16 slices of 256 along N" in out
    assert "backward: runs in 16 slices of 256 along N" in out
    assert main(["show", "leaky_relu", "--shape", "x=7"]) == 0
    assert "forward: runs whole" in capsys.readouterr().out


@pytest.mark.parametrize("args, says", [
    (["--shape", "x=4,a"], "--shape x: give whole sizes"),
    (["--shape", "x4"], "--shape takes NAME=DIMS"),
    (["--shape", "y=4"], "y is not one"),
    (["--shape", "x=4", "--shape", "w=2"], "w is not one"),
])
def test_show_names_a_bad_shape(capsys, args, says):
    assert main(["show", "leaky_relu", *args]) == 1
    assert says in capsys.readouterr().err


def test_a_missing_input_shape_is_named(capsys):
    assert main(["show", "conv2d_bias_leaky_relu", "--shape", "x=2,3,4,5"]) == 1
    assert "missing w, b" in capsys.readouterr().err
