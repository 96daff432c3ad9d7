"""The command line finds operators the way `build` does, reports every bad file, and fails with
one line, never a traceback."""
import os
import re
import shlex
import subprocess
import sys
import textwrap

import pytest

import opkit
from opkit.cli import main

from conftest import REPO, write_op
from test_api_cli import GOOD
from test_build_cache import TWICE


def _opkit(args, cwd=None, **env):
    return subprocess.run([sys.executable, "-m", "opkit", *args], capture_output=True, text=True,
                          env=dict(os.environ, **env), cwd=cwd, timeout=900)


def _tutorial():
    """The README tutorial: the file it writes, its YAML, its shell commands and its Python."""
    text = (REPO / "README.md").read_text()
    part = text.split("## Five-minute tutorial", 1)[1].split("\n## ", 1)[0]
    path = re.search(r"write `([\w/]+\.yaml)`", part).group(1)
    block = lambda lang: textwrap.dedent(re.search(rf"```{lang}\n(.*?)```", part, re.S).group(1))
    commands = [line.split("#")[0].strip() for line in block("bash").splitlines()]
    return path, block("yaml"), [c for c in commands if c], block("python")


def test_readme_tutorial_runs_as_written(tmp_path):
    path, yaml, commands, python = _tutorial()
    write_op(tmp_path / os.path.dirname(path), yaml, os.path.basename(path))
    assert commands[0].startswith("opkit build") and any(c.startswith("opkit show") for c in commands)
    for command in commands:
        args = shlex.split(command)
        assert args[0] == "opkit"
        r = _opkit(args[1:], cwd=tmp_path)
        assert r.returncode == 0, (command, r.stderr)
        if args[1] == "show":
            assert r.stdout.startswith("# soft_clip: ") and "## generated source" in r.stdout
    r = subprocess.run([sys.executable, "-c", python], capture_output=True, text=True,
                       cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr


@pytest.mark.slow
def test_show_validate_bench_find_operators_by_path(tmp_path):
    ops = tmp_path / "my_ops"
    write_op(ops, TWICE, "twice.yaml")
    write_op(ops, GOOD.format(name="cli_path_abs"), "abs.yaml")
    for args in (["show", "twice", "--path", str(ops), "--no-build"],
                 ["show", str(ops / "twice.yaml"), "--no-build"]):
        r = _opkit(args)
        assert r.returncode == 0 and r.stdout.startswith("# twice: "), (args, r.stderr)
    r = _opkit(["show", "my_ops", "--no-build"], cwd=tmp_path)       # a folder: each operator
    assert r.returncode == 0 and "# twice: " in r.stdout and "# cli_path_abs" in r.stdout, r.stderr
    r = _opkit(["validate", "twice", "cli_path_abs", "--path", str(ops)])
    assert r.returncode == 0 and "forward float64" in r.stdout, r.stderr
    r = _opkit(["bench", "twice", "--path", str(ops), "--sizes", "16", "--dtypes", "float64",
                "--layouts", "ND", "--passes", "forward", "--repeat", "1",
                "--json", str(tmp_path / "bench.json")])
    assert r.returncode == 0 and "twice forward ND 16" in r.stdout, r.stderr


def test_unknown_operator_error_says_how_to_find_it(capsys):
    assert main(["show", "no_such_op_anywhere"]) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("opkit show: error: no operator named 'no_such_op_anywhere'")
    assert "OPKIT_PATH" in err and "--path" in err


BAD_UNDEFINED = GOOD.format(name="rel_bad_a").replace("abs(x)", "abs(z)")   # line 7
BAD_SYNTAX = GOOD.format(name="rel_bad_b").replace("abs(x) + 1", "abs(x) +")  # line 7


def test_load_reports_every_bad_file(tmp_path):
    folder = tmp_path / "ops"
    write_op(folder, GOOD.format(name="rel_load_good"), "a.yaml")
    write_op(folder, BAD_UNDEFINED, "b.yaml")
    write_op(folder, BAD_SYNTAX, "c.yaml")
    with pytest.raises(opkit.SpecError) as info:
        opkit.load(folder)
    msg = str(info.value)
    assert re.search(r"b\.yaml:7\S*: .*undefined name 'z'", msg), msg
    assert re.search(r"c\.yaml:7\S*: .*syntax error", msg), msg
    assert [os.path.basename(e.loc.file) for e in info.value.errors] == ["b.yaml", "c.yaml"]
    assert "rel_load_good" not in opkit.list_ops()


def test_bad_file_on_opkit_path_is_skipped_and_listed_as_broken(tmp_path):
    folder = tmp_path / "ops"
    write_op(folder, GOOD.format(name="rel_path_good"), "a.yaml")
    write_op(folder, BAD_UNDEFINED, "b.yaml")
    r = subprocess.run([sys.executable, "-c", "import opkit; print(' '.join(opkit.list_ops()))"],
                       capture_output=True, text=True, env=dict(os.environ, OPKIT_PATH=str(folder)),
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "rel_path_good" in r.stdout.split() and "leaky_relu" in r.stdout.split()
    assert re.search(r"b\.yaml:7\S*: .*undefined name 'z'", r.stderr), r.stderr
    r = _opkit(["list"], OPKIT_PATH=str(folder))
    assert r.returncode == 1 and "rel_path_good" in r.stdout, r.stderr
    assert "b.yaml:7" in r.stdout + r.stderr and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("opkit list: error: ")


@pytest.mark.parametrize("exc", [PermissionError(13, "Permission denied", "/some/cache"),
                                 OSError(30, "Read-only file system", "/some/cache"),
                                 RuntimeError("an unexpected failure")],
                         ids=lambda e: type(e).__name__)
def test_every_cli_failure_is_one_line(monkeypatch, capsys, exc):
    import opkit.builder

    def fail(stale_only=False):
        raise exc
    monkeypatch.setattr(opkit.builder, "clean", fail)
    monkeypatch.delenv("OPKIT_DEBUG", raising=False)
    assert main(["clean"]) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("opkit clean: error: "), err
    assert (getattr(exc, "strerror", None) or str(exc)) in err
