"""The Python API (README: "The Python API") and the command line ("The command line")."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import opkit
from opkit.cli import main

from conftest import EXAMPLES, REPO, write_op

GOOD = textwrap.dedent("""\
    name: {name}
    inputs:
      x: {{dtypes: [float32, float64]}}
    outputs:
      y: {{like: x}}
    forward:
      y: abs(x) + 1
    """)


def test_registry_basics():
    names = opkit.list_ops()
    assert names == sorted(names) and "leaky_relu" in names
    op = opkit.get("leaky_relu")
    assert opkit.ops.leaky_relu is op and op.name == "leaky_relu"
    assert op.spec.input_names == ("x",) and op.spec.attr("alpha").default == 0.2
    assert "leaky_relu" in dir(opkit.ops)
    assert isinstance(opkit.SpecError("x"), ValueError)


def test_load_folder_and_file(tmp_path):
    folder = tmp_path / "ops"
    write_op(folder, GOOD.format(name="api_abs_a"), "a.yaml")
    write_op(folder, GOOD.format(name="api_abs_b"), "b.yml")
    (folder / "notes.txt").write_text("not an operator")
    assert opkit.load(folder) == ["api_abs_a", "api_abs_b"]
    assert opkit.load(folder / "a.yaml") == ["api_abs_a"]          # reloading the same file is fine
    np.testing.assert_array_equal(opkit.ops.api_abs_b(np.array([-2.0, 3.0])), [3.0, 4.0])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        opkit.load(tmp_path / "missing")


def test_load_is_all_or_nothing(tmp_path):
    folder = tmp_path / "ops"
    write_op(folder, GOOD.format(name="api_half_good"), "a.yaml")
    write_op(folder, GOOD.format(name="api_half_bad").replace("abs(x)", "abs(z)"), "b.yaml")
    with pytest.raises(opkit.SpecError, match=r"b\.yaml:7.*undefined name 'z'"):
        opkit.load(folder)
    assert "api_half_good" not in opkit.list_ops()


def test_registry_listeners_see_every_registration(tmp_path):
    from opkit.registry import Registry
    registry, seen = Registry(), []
    registry.load(write_op(tmp_path / "one", GOOD.format(name="api_seen_a")))
    registry.subscribe(lambda op: seen.append(op))          # the operators so far ...
    path = write_op(tmp_path / "two", GOOD.format(name="api_seen_b"))
    registry.load(path)                                       # ... those registered later ...
    registry.load(path)                                       # ... and again when reloaded
    assert [op.name for op in seen] == ["api_seen_a", "api_seen_b", "api_seen_b"]
    assert seen[1] is not seen[2] and seen[2] is registry.get("api_seen_b")


def test_name_clash_between_files(tmp_path):
    write_op(tmp_path / "one", GOOD.format(name="api_clash"))
    write_op(tmp_path / "two", GOOD.format(name="api_clash"))
    opkit.load(tmp_path / "one")
    with pytest.raises(opkit.SpecError, match="already registered from"):
        opkit.load(tmp_path / "two")
    with pytest.raises(opkit.SpecError, match="'leaky_relu' is already registered"):
        opkit.load(write_op(tmp_path / "three", GOOD.format(name="leaky_relu")))


def _python(code, **env):
    full = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full,
                          timeout=300, cwd=str(REPO.parent))


def test_opkit_path_and_cache_dir_environment(tmp_path):
    cache = tmp_path / "cache"
    r = _python("import numpy as np, opkit; print(opkit.list_ops());"
                "print(opkit.ops.clipped_elu(np.array([-1.0, 9.0])).tolist())",
                OPKIT_PATH=os.pathsep.join([str(EXAMPLES), str(tmp_path / "nothing-here")]),
                OPKIT_CACHE_DIR=str(cache))
    assert r.returncode == 0, r.stderr
    names, values = r.stdout.splitlines()
    assert "clipped_elu" in names and "scaled_leaky_relu" in names and "leaky_relu" in names
    assert eval(values)[1] == 6.0
    assert any(p.name.startswith("clipped_elu-") for p in cache.iterdir())
    assert "was not loaded" in r.stderr  # the missing folder is reported, not fatal
    # the first call compiles, and says so on stderr (once: the second process finds the cache)
    assert f"opkit: compiling clipped_elu (new or changed: several seconds, once; then cached in {cache})" \
        in r.stderr.splitlines()
    again = _python("import numpy as np, opkit; opkit.ops.clipped_elu(np.array([1.0]))",
                    OPKIT_PATH=str(EXAMPLES), OPKIT_CACHE_DIR=str(cache))
    assert again.returncode == 0 and "compiling" not in again.stderr, again.stderr


def test_broken_file_on_opkit_path_warns(tmp_path):
    write_op(tmp_path / "bad", "name: broken\ninputs: [x]\n")
    r = _python("import opkit; print(len(opkit.list_ops()))", OPKIT_PATH=str(tmp_path / "bad"))
    assert r.returncode == 0, r.stderr
    assert "was not loaded" in r.stderr and "op.yaml:2" in r.stderr


@pytest.mark.slow
def test_cli_build_list_show_validate_clean(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OPKIT_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["build", "-q", str(EXAMPLES)]) == 0
    out, err = capsys.readouterr()
    assert "clipped_elu" in out and "scaled_leaky_relu" in out and "miss" in out
    assert "compiling" not in err  # the progress display and the table say what compiled
    assert out.count("pass (") == 3
    assert main(["build", "-q", str(EXAMPLES)]) == 0
    out = capsys.readouterr().out
    assert out.count(" hit ") == 3 and "miss" not in out
    assert main(["list"]) == 0
    assert "clipped_elu" in capsys.readouterr().out
    assert main(["show", "leaky_relu"]) == 0
    shown = capsys.readouterr().out
    for needle in ("## declaration", "dx = sum_to(where(x > 0, dy, dy * alpha), x)", "derived",
                   "vcmpgt", "vmuls", "vsel", "vectorized", "@generated from templates/module.pyx.j2",
                   "schedule: tile 256"):
        assert needle in shown, needle
    assert main(["validate", "leaky_relu"]) == 0
    assert "forward float16" in capsys.readouterr().out
    assert main(["clean"]) == 0
    assert "removed" in capsys.readouterr().out
    assert not any(p.name.startswith("clipped_elu-") for p in (tmp_path / "cache").iterdir())


def test_build_starts_the_largest_sources_first():
    """`opkit build` hands the compiles to its workers largest generated source first (the
    bundled convolutions before leaky_relu); an operator whose source cannot be generated goes
    last, where its build reports why."""
    from opkit.cli import _longest_first

    class Broken:
        def source(self):
            raise ValueError("no source")

    ops = [opkit.get(n) for n in ("leaky_relu", "conv2d_bn_train_leaky_relu", "spatial_leaky_relu")]
    broken = Broken()
    order = _longest_first(ops + [broken])
    sizes = [len(op.source()) for op in order[:-1]]
    assert sizes == sorted(sizes, reverse=True) and order[-1] is broken
    assert order[0].name == "conv2d_bn_train_leaky_relu"


def test_cli_errors_are_one_line_reasons(tmp_path, capsys):
    assert main(["show", "no_such_op"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("opkit show: error: no operator named 'no_such_op'")
    write_op(tmp_path / "bad", GOOD.format(name="cli_bad").replace("abs(x) + 1", "abs(x) +"))
    assert main(["build", str(tmp_path / "bad")]) == 1
    err = capsys.readouterr().err
    assert "opkit build: error:" in err and "op.yaml:7" in err and "syntax error" in err


def test_console_script():
    exe = os.path.join(os.path.dirname(sys.executable), "opkit")
    r = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == f"opkit {opkit.__version__}"
    r = subprocess.run([sys.executable, "-m", "opkit", "list"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "leaky_relu" in r.stdout


def test_build_gathers_fusion_notes_into_lines_after_the_table(monkeypatch):
    """`opkit build` without SciPy: one line says what to install and what it changes, instead
    of a FusionWarning with a source line per operator; the warnings of every build thread are
    caught, and other notes keep a line each."""
    import concurrent.futures
    import warnings

    from opkit import FusionWarning
    from opkit.cli import _fusion_notes, _summarized

    def warn(i):
        for op in ("conv2d_bias_leaky_relu", "conv2d_bn_leaky_relu")[i % 2:]:
            warnings.warn(f"Cannot fuse the epilogue of conv2d (/x/operators/{op}.yaml:12:6): no "
                          "GEMM backend for fused calls; the steps run one after another", FusionWarning)
        warnings.warn("Cannot fuse gt with preceding op conv2d: a condition", FusionWarning)

    with _fusion_notes() as notes, concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(warn, range(4)))
    assert len(notes) == 10
    monkeypatch.delenv("OPKIT_BLAS", raising=False)
    monkeypatch.setenv("OPKIT_GEMM", "blas")
    assert _summarized(notes) == [
        "note: Cannot fuse gt with preceding op conv2d: a condition",
        "note: OPKIT_GEMM=blas and SciPy is not installed, so 2 operator(s) (conv2d_bias_leaky_relu, "
        "conv2d_bn_leaky_relu) run their convolution or matmul and the elementwise work after it "
        "one after the other instead of fused (same results, slower): pip install scipy, or "
        "unset OPKIT_GEMM for opkit's own GEMM, to fuse them"]
    monkeypatch.setenv("OPKIT_BLAS", "none")
    assert _summarized(notes)[1].startswith("note: OPKIT_GEMM=none, so 2 operator(s)")
    assert _summarized(notes)[1].endswith("unset OPKIT_GEMM (and OPKIT_BLAS) to fuse them")
    with pytest.warns(FusionWarning):  # outside the build, a FusionWarning is a warning again
        warn(1)
