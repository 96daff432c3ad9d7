"""Shared fixtures. Kernels are compiled into one cache for the whole run: OPKIT_CACHE_DIR when
the environment sets it (CI points it at a temporary folder), otherwise a fresh temporary folder.
Tests that exercise the cache itself use folders of their own."""
import json
import os
import tempfile
from pathlib import Path

import pytest

if not os.environ.get("OPKIT_CACHE_DIR"):
    os.environ["OPKIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="opkit-test-cache-")
# the tests compile their own kernels, whether or not the opkit they import carries modules
# built ahead of time (an installed one does); the shipping tests turn them back on
os.environ["OPKIT_PREBUILT"] = "0"

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples" / "user_ops"


# Modules whose tests compile nothing: parsing, derivation, lowering and rendering. Every other
# test is marked `build`, and `pytest -m "not build"` runs the front end alone in seconds. A test
# here that compiles anyway fails (see `_front_end_builds_nothing`), unless marked `build` itself.
FRONT_END = {"test_spec", "test_dsl", "test_lower_codegen", "test_architecture", "test_dsl_breadth",
             "test_onnx_lowering", "test_deploy_units"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.module.__name__ not in FRONT_END:
            item.add_marker(pytest.mark.build)


@pytest.fixture(autouse=True)
def _front_end_builds_nothing(request, monkeypatch):
    if request.node.get_closest_marker("build") is None:
        from opkit.builder import compile as compile_mod

        def refuse(*args, **kwargs):
            raise AssertionError("a front-end test compiled a module: mark it `build`")
        monkeypatch.setattr(compile_mod, "_compile", refuse)


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture
def own_cache(tmp_path, monkeypatch) -> Path:
    """A private, empty build cache for one test."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("OPKIT_CACHE_DIR", str(cache))
    return cache


def write_op(folder: Path, text: str, name: str = "op.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    return path


FLOATS = "{dtypes: [float32, float64]}"


def declaration(forward, inputs=("x",), attrs=None, outputs=None, name="t"):
    """YAML text of an operator.

    forward: {name: expression} (or "expression" for a single output y); inputs: names (float32
    and float64, layout-agnostic) or (name, flow mapping) pairs; attrs: {name: flow mapping};
    outputs: names (default: the last forward line)."""
    if isinstance(forward, str):
        forward = {"y": forward}
    lines = [f"name: {name}", "inputs:"]
    for i in inputs:
        iname, body = (i, FLOATS) if isinstance(i, str) else i
        lines.append(f"  {iname}: {body}")
    if attrs:
        lines.append("attrs:")
        lines += [f"  {k}: {v}" for k, v in attrs.items()]
    lines.append("outputs:")
    for o in outputs or [list(forward)[-1]]:
        lines.append(f"  {o}: {{}}")
    lines.append("forward:")
    # double-quoted YAML scalars: expressions may contain YAML indicators (|, &, ~, :)
    lines += [f"  {k}: {json.dumps(v)}" for k, v in forward.items()]
    return "\n".join(lines) + "\n"
