"""Modules built ahead of time (shipped in a wheel) are found after the user's cache, with or
without a compiler, only when this process can load them."""
import json
import os
import shutil
import sys

import numpy as np
import pytest

import opkit.builder.cache as cache
import opkit.builder.compile as compile_mod
from opkit.errors import BuildError
from opkit.registry import make_op

from conftest import write_op
from test_build_cache import TWICE

toolchain_mod = sys.modules["opkit.builder.toolchain"]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """TWICE compiled once for the module, in a cache of its own."""
    root = tmp_path_factory.mktemp("compiled")
    op_file = write_op(root / "ops", TWICE)
    old = os.environ.get("OPKIT_CACHE_DIR")
    os.environ["OPKIT_CACHE_DIR"] = str(root / "cache")
    try:
        return op_file, make_op(op_file).build().entry
    finally:
        os.environ["OPKIT_CACHE_DIR"] = old


@pytest.fixture
def shipped(compiled, tmp_path, monkeypatch):
    """That entry copied to a shipped folder; an empty user cache; any compile from here on
    fails the test."""
    op_file, built = compiled
    folder = tmp_path / "shipped"
    shutil.copytree(built, folder / built.name)
    monkeypatch.setenv("OPKIT_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.delenv("OPKIT_PREBUILT")
    monkeypatch.setattr(cache, "_SHIPPED", [folder])
    cache._recorded_width.cache_clear()

    def refuse(*args, **kwargs):
        raise AssertionError("compiled instead of using the shipped module")
    monkeypatch.setattr(compile_mod, "_compile", refuse)
    return op_file, folder / built.name


def test_a_shipped_module_is_used_instead_of_compiling(shipped):
    op_file, entry = shipped
    op = make_op(op_file)
    result = op.build()
    assert result.cached and result.entry == entry
    np.testing.assert_array_equal(op(np.arange(3.0)), [0.0, 2.0, 4.0])
    assert not (entry.parent.parent / "empty-cache").exists()  # nothing was written


def _without_a_compiler(monkeypatch, tmp_path):
    """PATH and CC leave this process no C compiler (skips where one is found anyway)."""
    empty = tmp_path / "bin-without-cc"
    empty.mkdir()
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(empty))
    from opkit.builder import toolchain
    if toolchain().available:
        pytest.skip("a C compiler is found without PATH")


def test_a_shipped_module_is_used_without_a_compiler(shipped, monkeypatch, tmp_path):
    op_file, entry = shipped
    _without_a_compiler(monkeypatch, tmp_path)
    assert make_op(op_file).build().entry == entry


def test_another_cython_is_fine_another_numpy_major_is_not(shipped, monkeypatch):
    op_file, entry = shipped
    cython, numpy = toolchain_mod._versions()
    monkeypatch.setattr(toolchain_mod, "_versions", lambda: ("0.0.1", numpy))
    assert make_op(op_file).build().entry == entry
    major = int(numpy.split(".")[0])
    monkeypatch.setattr(toolchain_mod, "_versions", lambda: (cython, f"{major + 1}.0.0"))
    with pytest.raises(AssertionError, match="compiled instead"):
        make_op(op_file).build()


def test_a_native_module_needs_every_flag_of_the_cpu_it_was_built_on(shipped):
    op_file, entry = shipped
    meta = json.loads((entry / "meta.json").read_text())
    assert meta["cpu_flags"], "a native build records its CPU's flags"
    meta["cpu_flags"].append("a_flag_no_cpu_has")
    (entry / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(AssertionError, match="compiled instead"):
        make_op(op_file).build()


def test_a_damaged_shipped_module_is_not_loaded(shipped):
    op_file, entry = shipped
    so = next(p for p in entry.iterdir() if p.name.endswith((".so", ".pyd")))
    os.chmod(so, 0o644)
    with open(so, "r+b") as fh:
        fh.seek(100)
        fh.write(b"\0" * 16)
    with pytest.raises(AssertionError, match="compiled instead"):
        make_op(op_file).build()


@pytest.mark.parametrize("wrong", ["damaged", "cpu", "numpy"])
def test_without_a_compiler_a_refused_shipped_module_is_named(shipped, monkeypatch, tmp_path,
                                                             wrong):
    """No compiler, and the one shipped module for this content cannot serve: the error says
    which module, what it needs and what this process has, not only that there is no compiler."""
    op_file, entry = shipped
    so = next(p for p in entry.iterdir() if p.name.endswith((".so", ".pyd")))
    meta = json.loads((entry / "meta.json").read_text())
    if wrong == "damaged":
        os.chmod(so, 0o644)
        os.truncate(so, 1000)
        want = f"{so.name} has 1000 bytes"
    elif wrong == "cpu":
        meta["cpu_flags"].append("a_flag_no_cpu_has")
        want = "it needs CPU features this CPU lacks: a_flag_no_cpu_has"
    else:
        meta["content"]["toolchain"]["numpy"] = "99.0.0"
        want = f"built against NumPy 99.0.0 and runs on that or a newer NumPy of the same " \
               f"major version; this process has {np.__version__}"
    (entry / "meta.json").write_text(json.dumps(meta))
    _without_a_compiler(monkeypatch, tmp_path)
    with pytest.raises(BuildError) as info:
        make_op(op_file).build()
    msg = str(info.value)
    assert f"the shipped module {entry} is not used: " in msg and want in msg, msg
    assert "C compiler" in msg, msg


def test_opkit_prebuilt_0_ignores_the_shipped_modules(shipped, monkeypatch):
    op_file, entry = shipped
    monkeypatch.setenv("OPKIT_PREBUILT", "0")
    with pytest.raises(AssertionError, match="compiled instead"):
        make_op(op_file).build()
