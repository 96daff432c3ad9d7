"""Properties of the pipeline as a whole: what importing costs, and where the cache key comes from."""
import os
import shutil
import subprocess
import sys
import textwrap

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
