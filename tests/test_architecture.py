"""Properties of the pipeline as a whole: what importing costs, where the cache key comes from,
and which way the modules of opkit.bench import each other."""
import ast
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List, Optional, Set

import pytest

from conftest import REPO, write_op

TWICE = """name: twice_moved
inputs:
  x: {dtypes: [float32, float64]}
outputs:
  y: {like: x}
forward:
  y: x * 2
"""


def run(code, env=None, cwd=None):
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, env=env, cwd=cwd)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_import_starts_no_process_and_reads_no_cpu_features():
    out = run("""
        import subprocess
        def refuse(*args, **kwargs):
            raise AssertionError(f"started {args} at import")
        subprocess.Popen = refuse
        import opkit
        from opkit import target
        names = opkit.list_ops()
        for name in names:  # every bundled operator is checked and lowered: still nothing runs
            opkit.get(name).lowered()
        print(len(names), target.cpu_flags.cache_info().misses)  # /proc/cpuinfo unread
        """)
    count, probes = out.split()
    assert int(count) >= 5 and probes == "0"


@pytest.mark.build
def test_moved_declarations_and_checkouts_hit_the_cache(tmp_path, own_cache):
    """The key is the content: neither the folder of a declaration nor of opkit itself enters it."""
    first = write_op(tmp_path / "a" / "ops", TWICE, "twice.yaml")
    second = tmp_path / "b" / "elsewhere" / "ops"
    second.mkdir(parents=True)
    shutil.copy(first, second / "twice.yaml")
    for tree in ("one", "two"):  # two copies of the checkout
        dest = tmp_path / tree
        for part in ("opkit", "templates", "operators"):
            shutil.copytree(REPO / part, dest / part,
                            ignore=shutil.ignore_patterns("__pycache__"))
    env = dict(os.environ, OPKIT_CACHE_DIR=str(own_cache))
    code = """
        import sys, opkit
        name, = opkit.load(sys.argv[1])
        r = opkit.get(name).build()
        print(opkit.__file__, r.cached, r.key)
        """
    results = []
    for tree, ops in (("one", first.parent), ("two", second)):
        env["PYTHONPATH"] = str(tmp_path / tree)
        res = subprocess.run([sys.executable, "-c", textwrap.dedent(code), str(ops)],
                             capture_output=True, text=True, env=env, cwd=str(tmp_path))
        assert res.returncode == 0, res.stderr
        results.append(res.stdout.split())
    (file1, cached1, key1), (file2, cached2, key2) = results
    assert file1.startswith(str(tmp_path / "one")) and file2.startswith(str(tmp_path / "two"))
    assert cached1 == "False" and cached2 == "True" and key1 == key2


# ------------------------------------------------------------------------------- opkit.bench

BENCH = REPO / "opkit" / "bench"


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.AST) -> List[ast.AST]:
    """Every import statement of a parsed file, at its top or inside a function."""
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


def _parsed(path: Path) -> ast.AST:
    return ast.parse(path.read_text(), str(path))


def _targets(node: ast.AST, path: Path) -> Set[str]:
    """The absolute names an import statement may load: `from X import a` is X and X.a (a may
    be a submodule), relative imports resolved against the file's package."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names}
    base = node.module or ""
    if node.level:
        package = _module_name(path).split(".")
        if path.name != "__init__.py":
            package = package[:-1]
        package = package[:len(package) - node.level + 1]
        base = ".".join(package + ([node.module] if node.module else []))
    return {base} | {f"{base}.{a.name}" for a in node.names}


def _bench_graph() -> Dict[str, Set[str]]:
    """opkit.bench's modules, each with the modules of opkit.bench it imports (`from . import
    x` is an edge to x, not to the package; a name imported from the package is one to it)."""
    modules = {_module_name(p): p for p in sorted(BENCH.glob("*.py"))}
    graph = {}
    for name, path in modules.items():
        edges = set()
        for node in _imports(_parsed(path)):
            found = _targets(node, path)
            subs = found & set(modules) - {"opkit.bench"}
            edges |= subs or (found & {"opkit.bench"})
        graph[name] = edges - {name}
    return graph


def _cycle(graph: Dict[str, Set[str]]) -> Optional[List[str]]:
    """One import cycle of the graph (its modules in order, the first repeated), or None."""
    state: Dict[str, int] = {}   # 1: on the current path, 2: done
    path: List[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_cycle_finder_finds_cycles():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_bench_modules_import_each_other_one_way_and_never_the_cli():
    graph = _bench_graph()
    assert {"opkit.bench", "opkit.bench.harness", "opkit.bench.command"} <= set(graph)
    for path in BENCH.glob("*.py"):
        for node in _imports(_parsed(path)):
            cli = {t for t in _targets(node, path) if t == "opkit.cli" or t.startswith("opkit.cli.")}
            assert not cli, f"{path.relative_to(REPO)}:{node.lineno} imports opkit.cli"
    assert _cycle(graph) is None, f"an import cycle in opkit.bench: {' -> '.join(_cycle(graph))}"
    assert graph["opkit.bench.harness"] == set(), "the harness imports nothing else from opkit.bench"
    assert graph["opkit.bench"] >= {"opkit.bench.command"}


def test_the_cli_imports_the_bench_command_plainly():
    """`opkit bench` is one of opkit's commands: a failing import of it is an error, not a
    command that is silently missing."""
    path = REPO / "opkit" / "cli.py"
    tree = _parsed(path)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in _imports(tree):
        if any(t == "opkit.bench" or t.startswith("opkit.bench.") for t in _targets(node, path)):
            found.append(node)
            up = parents.get(node)
            while up is not None:
                assert not isinstance(up, ast.Try), f"opkit/cli.py:{node.lineno} imports opkit.bench in a try"
                up = parents.get(up)
    assert found, "opkit/cli.py does not import opkit.bench"
