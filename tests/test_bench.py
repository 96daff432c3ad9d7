"""`opkit bench` runs and records what it measured (it asserts no time: the machine is shared)."""
import json

import numpy as np

from opkit import bench
from opkit.cli import main


def test_generic_bench_writes_rows(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert main(["bench", "leaky_relu", "spatial_leaky_relu", "--sizes", "16,40K", "--dtypes",
                 "float32,float16", "--layouts", "ND,NHWC", "--repeat", "2", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "leaky_relu forward ND 16" in text and "spatial_leaky_relu backward NHWC 40960" in text
    data = json.loads(out.read_text())
    assert data["machine"]["cores"] >= 1 and data["machine"]["numpy"] == np.__version__
    rows = data["rows"]
    assert {r["op"] for r in rows} == {"leaky_relu", "spatial_leaky_relu"}
    assert {r["pass_"] for r in rows} == {"forward", "backward"}
    for r in rows:
        assert r["bytes"] > 0 and r["seconds"]["opkit"] > 0 and r["seconds"]["numpy"] > 0


def test_targets_are_ratios_of_one_run():
    row = bench.Row("case", "op", "forward", "float32", (4,), 32, {"opkit": 1.0, "numpy": 6.0, "copy": 0.5})
    assert row.ratio("numpy") == 6.0 and row.gbps("opkit") == 32e-9 and row.ratio("torch") is None
    met = bench.TargetResult("case", "vs numpy", row.ratio("numpy"), 5.0)
    unknown = bench.TargetResult("case", "vs torch", row.ratio("torch"), 1.0)
    assert met.met and unknown.met is None
    text = bench.format_targets([met, unknown])
    assert "met" in text and "n/a (torch not installed)" in text
    assert "case" in bench.format_rows([row])


def test_timed_takes_medians_of_interleaved_rounds():
    calls = []
    t = bench.timed({"a": lambda: calls.append("a"), "b": lambda: calls.append("b"), "none": None}, 3)
    assert set(t) == {"a", "b"} and all(v >= 0 for v in t.values())
    assert calls[:4] == ["a", "b", "a", "b"]
