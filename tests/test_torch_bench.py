"""The PyTorch cases of `opkit bench`: what they run and report (no time is asserted)."""
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from opkit import bench  # noqa: E402
from opkit.bench import cases, targets  # noqa: E402


def test_torch_cases_run_and_report_the_call_next_to_the_numpy_level_call():
    rng = np.random.default_rng(0)
    rows = []
    for name, build in [("torch.ops.opkit.leaky_relu, 16 elements", lambda: cases.torch_call_case(16, rng)),
                        ("torch.ops.opkit.leaky_relu fwd+bwd", lambda: cases.torch_autograd_case(64, rng))]:
        fns, nbytes = build()
        rounds = {}
        seconds = bench.timed(fns, 3, rounds=rounds, shuffle=rng)
        rows.append(bench.Row(name, "leaky_relu", "forward", "float32", (16,), nbytes, seconds, rounds))
        assert set(seconds) == set(fns) and all(len(v) == 3 for v in rounds.values())
    assert set(rows[0].seconds) == {"opkit", "opkit numpy", "torch"}
    assert set(rows[1].seconds) == {"opkit", "torch"}
    notes = bench.torch_notes(rows)
    assert len(notes) == 2 and "through torch.ops" in notes[0] and "NumPy-level" in notes[0]
    assert "PyTorch" in notes[1] and "NumPy-level" not in notes[1]


def test_each_round_runs_in_a_new_order_when_shuffled():
    calls = []
    # each call long enough to be timed alone (one call per function and round)
    fns = {k: (lambda k=k: (calls.append(k), time.sleep(0.003))) for k in "abcd"}
    bench.timed(fns, 20, warmup=0, shuffle=np.random.default_rng(1))
    rounds = [tuple(calls[i:i + 4]) for i in range(4, len(calls), 4)]  # after the sizing calls
    assert all(sorted(r) == list("abcd") for r in rounds) and len(set(rounds)) > 1


def test_a_case_without_what_it_compares_with_reports_its_targets_as_unknown(monkeypatch):
    monkeypatch.setattr(targets, "TARGETS", [("absent", lambda r: None, (1,), "float32", "forward",
                                              [("vs something", "torch", "opkit", 1.0)])])
    rows, results = bench.run_targets(2, np.random.default_rng(0))
    assert rows == [] and len(results) == 1 and results[0].met is None


def test_a_case_can_ask_for_more_rounds(monkeypatch):
    case = ("tight", lambda r: ({"opkit": lambda: None, "torch": lambda: None}, 8), (1,), "float32",
            "forward", [("vs torch", "torch", "opkit", 1.0)], {"shuffle": True, "rounds": 7})
    monkeypatch.setattr(targets, "TARGETS", [case])
    rows, results = bench.run_targets(2, np.random.default_rng(0))
    assert [len(v) for v in rows[0].rounds.values()] == [7, 7] and results[0].ratio is not None
