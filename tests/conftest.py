"""Shared fixtures, markers, Hypothesis profiles and the summary of what was skipped.

Kernels are compiled into one cache for the whole run: OPKIT_CACHE_DIR when the environment sets
it (CI points it at the cache its `pip install .` and `opkit build` filled), otherwise a fresh
temporary folder. The run's pytest-xdist workers inherit it from the controller, so an operator
is compiled once per run whichever worker asks first (the cache's file locks make the others
wait). Tests that exercise the cache itself use folders of their own (`own_cache`, seeded with
the run's runtime object, and `empty_cache`).

Markers (tests/README.md): `build` (compiles kernels: every module outside FRONT_END), `slow`
(over about ten seconds), `system` (runs other processes: the command line, pip, wheels, DDP).
`OPKIT_HYPOTHESIS=dev` runs the property tests longer than the `ci` profile.
"""
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Tuple

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
             "test_onnx_lowering", "test_deploy_units", "test_exec_schedule", "test_conftest"}


# Modules whose tests run other processes (the command line, pip, compilers killed on purpose,
# wheels, two-process DDP, the type checker): marked `system`.
SYSTEM = {"test_api_cli", "test_build_cache", "test_deploy_wheels", "test_packaging",
          "test_reliability_cache", "test_reliability_cli", "test_reliability_compiler",
          "test_torch_distributed", "test_torch_optional", "test_types"}


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: every core, but one process for the front end alone (`-m "not build"`), where
    starting workers (each importing and collecting the suite) costs more than it saves."""
    if (config.option.markexpr or "").replace(" ", "") == "notbuild":
        return 0
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.module.__name__ not in FRONT_END:
            item.add_marker(pytest.mark.build)
        if item.module.__name__ in SYSTEM:
            item.add_marker(pytest.mark.system)


UNGROUPED = pytest.StashKey[str]()


def pytest_collection_finish(session):
    """Under `--dist loadgroup` each worker tags a grouped test's id with its group (`id@group`),
    and the scheduler keeps a group on one worker, so a module's fixture is built once. A pytest
    that drops the tag (9.2 with pytest-xdist 3.8) silently spreads a group over the workers,
    which build its wheels once each: the grouped tests fail instead, saying why."""
    if getattr(session.config.option, "loadgroup", False) and any(
            item.get_closest_marker("xdist_group") and "@" not in item.nodeid
            for item in session.items):
        session.config.stash[UNGROUPED] = (
            f"pytest-xdist's --dist loadgroup did not tag the tests marked xdist_group with their "
            f"group under pytest {pytest.__version__} (pytest-xdist issue 1386), so it would "
            f"spread them over the workers; install the test extra's pytest: "
            f"pip install \".[test]\"")


def pytest_runtest_setup(item):
    if item.get_closest_marker("xdist_group") and UNGROUPED in item.config.stash:
        pytest.fail(item.config.stash[UNGROUPED], pytrace=False)


# ------------------------------------------------------------------ Hypothesis profiles

try:
    from hypothesis import HealthCheck, settings as _hypothesis

    # ci: bounded and reproducible (derandomized: the same examples every run); dev: five times
    # the examples, a fresh draw each run
    _hypothesis.register_profile("ci", deadline=None, derandomize=True, database=None,
                                 suppress_health_check=list(HealthCheck))
    _hypothesis.register_profile("dev", deadline=None, suppress_health_check=list(HealthCheck))
    HYPOTHESIS_PROFILE = os.environ.get("OPKIT_HYPOTHESIS", "ci")
    _hypothesis.load_profile(HYPOTHESIS_PROFILE)
except ImportError:  # pragma: no cover - hypothesis is a test extra
    HYPOTHESIS_PROFILE = "ci"


def examples(n: int) -> int:
    """A property test's example count: `n` under the ci profile, 5 n under dev."""
    return n * 5 if HYPOTHESIS_PROFILE == "dev" else n


# ------------------------------------------------------------------ what was skipped, and why

# an optional dependency's module -> the command that installs it
INSTALL = {"torch": "pip install torch==2.13.0", "onnx": "pip install onnx onnxruntime",
           "onnxruntime": "pip install onnx onnxruntime", "scipy": "pip install scipy",
           "sklearn": "pip install scikit-learn", "matplotlib": "pip install matplotlib",
           "ml_dtypes": "pip install ml_dtypes", "hypothesis": "pip install hypothesis",
           "mpmath": "pip install mpmath"}
_MISSING = re.compile(r"(?:could not import|No module named) '([\w.]+)'")


def _cases(path: Path) -> Tuple[int, bool]:
    """The test cases of a test module that could not be imported, counted from its source:
    each test function times the length of each `parametrize` list written out in place; and
    whether that is exact (False: some list is computed, so the count is a lower bound)."""
    import ast
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        return 1, False
    total, exact = 0, True
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            n = 1
            for d in node.decorator_list:
                if isinstance(d, ast.Call) and getattr(d.func, "attr", "") == "parametrize":
                    values = d.args[1] if len(d.args) > 1 else None
                    if isinstance(values, (ast.List, ast.Tuple)):
                        n *= max(len(values.elts), 1)
                    else:
                        exact = False
            total += n
    return max(total, 1), exact


def pytest_terminal_summary(terminalreporter):
    """One line per missing optional dependency (how many tests it skipped, how to install it),
    and one per other reason, so no test is skipped in silence. A module skipped whole when
    it is imported counts its test cases."""
    missing, other, bound = {}, {}, set()
    for report in terminalreporter.stats.get("skipped", []):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        count, exact = 1, True
        if isinstance(report, pytest.CollectReport):
            count, exact = _cases(REPO / report.nodeid.split("::")[0])
        m = _MISSING.search(reason)
        key = m.group(1).split(".")[0] if m else reason.removeprefix("Skipped: ")
        table = missing if m else other
        table[key] = table.get(key, 0) + count
        if not exact:
            bound.add(key)
    if not missing and not other:
        return
    terminalreporter.section("skipped")
    for module, count in sorted(missing.items()):
        at_least = "at least " if module in bound else ""
        terminalreporter.write_line(f"{module}: {at_least}{count} tests skipped; "
                                    f"{INSTALL.get(module, f'pip install {module}')}")
    for reason, count in sorted(other.items()):
        terminalreporter.write_line(f"{count} tests skipped: {reason}")


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


@pytest.fixture(scope="session")
def runtime_entry() -> Path:
    """The run cache's entry of the kernel runtime object for the native toolchain (compiled
    once per toolchain, linked into every module; opkit/builder/runtime.py)."""
    from opkit.builder import toolchain
    from opkit.builder.runtime import runtime_object
    return runtime_object(toolchain(), 600).parent


@pytest.fixture
def empty_cache(tmp_path, monkeypatch) -> Path:
    """A private, empty build cache for one test (the runtime object too is compiled in it)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("OPKIT_CACHE_DIR", str(cache))
    return cache


@pytest.fixture
def own_cache(empty_cache, runtime_entry) -> Path:
    """A private build cache for one test, holding only the run's runtime object: modules
    compile and link as in an empty cache, without compiling the runtime again."""
    shutil.copytree(runtime_entry, empty_cache / runtime_entry.name)
    return empty_cache


def source_copy(folder: Path) -> Path:
    """A copy of the repository's sources to build a wheel from: pip builds in place (a
    build/ folder beside setup.py), and two builds of one folder, or a build's leftovers,
    would mix."""
    dest = folder / "opkit-src"
    shutil.copytree(REPO, dest, ignore=shutil.ignore_patterns(
        ".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis"))
    return dest


def write_op(folder: Path, text: str, name: str = "op.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    return path


FLOATS = "{dtypes: [float32, float64]}"


def checked_calls(op, monkeypatch) -> list:
    """A list that records each call of `op`'s class that takes the checked path (its direct
    call declined or absent)."""
    calls = []
    original = type(op)._prepare

    def spy(self, *a, **k):
        calls.append(a)
        return original(self, *a, **k)

    monkeypatch.setattr(type(op), "_prepare", spy)
    return calls


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
