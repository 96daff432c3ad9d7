"""Shipping, the parts that need no compiler: operator packages in the registry (origins, name
clashes), the wheel `opkit package` writes, the ISA policy's choices and NumPy compatibility."""
import base64
import hashlib
import zipfile
from pathlib import Path

import pytest

import opkit.target as target
from opkit.builder.cache import numpy_compatible
from opkit.packaging.aot import distribution_isas, parse_isas
from opkit.packaging.plugins import Package
from opkit.packaging.wheel import names_for, write_wheel
from opkit.registry import Registry

from conftest import write_op

OP = "name: {name}\ninputs:\n  x: {{dtypes: [float32]}}\noutputs:\n  y: {{like: x}}\nforward:\n  y: x * 2\n"


def _package(tmp_path: Path, label: str, *names: str) -> Package:
    folder = tmp_path / label.split()[0] / "operators"
    for n in names:
        write_op(folder, OP.format(name=n), f"{n}.yaml")
    return Package(label, folder, None)


def test_packages_register_with_their_origin(tmp_path):
    reg = Registry()
    reg.load(write_op(tmp_path / "bundled", OP.format(name="base")).parent, origin="opkit")
    errors = reg.load_packages([_package(tmp_path, "alpha 1.0", "a1", "a2"),
                                _package(tmp_path, "beta 2.1", "b1")])
    assert errors == [] and reg.names() == ["a1", "a2", "b1", "base"]
    assert [reg.origin(n) for n in reg.names()] == ["alpha 1.0", "alpha 1.0", "beta 2.1", "opkit"]
    reg.load(write_op(tmp_path / "mine", OP.format(name="mine")).parent)
    assert reg.origin("mine") == ""  # opkit.load: `opkit list` shows its folder


def test_a_name_two_packages_declare_is_an_error_naming_both(tmp_path):
    reg = Registry()
    reg.load(write_op(tmp_path / "bundled", OP.format(name="base")).parent, origin="opkit")
    errors = reg.load_packages([_package(tmp_path, "alpha 1.0", "same", "a"),
                                _package(tmp_path, "beta 2.1", "same", "base")])
    assert len(errors) == 2 and reg.package_errors() == errors
    same = next(e for e in errors if "'same'" in e)
    assert "alpha 1.0" in same and "beta 2.1" in same and "same.yaml" in same
    assert "uninstall one of the packages" in same
    clash = next(e for e in errors if "'base'" in e)
    assert "opkit" in clash and "beta 2.1" in clash
    assert reg.names() == ["a", "base"]  # neither package's `same`; opkit's own `base` stays
    assert reg.origin("base") == "opkit"
    with pytest.raises(KeyError, match="declared by both alpha 1.0"):
        reg.get("same")


def test_a_bad_file_in_a_package_is_reported_and_the_rest_registered(tmp_path):
    pkg = _package(tmp_path, "gamma 0.1", "good")
    write_op(pkg.operators, "name: bad\ninputs: [x]\n", "bad.yaml")
    reg = Registry()
    errors = reg.load_packages([pkg])
    assert reg.names() == ["good"]
    assert len(errors) == 1 and errors[0].startswith("operator package gamma 0.1: ") and "bad.yaml" in errors[0]


def _record_ok(zf: zipfile.ZipFile, info: str):
    rows = [line.split(",") for line in zf.read(f"{info}/RECORD").decode().splitlines()]
    for name, digest, size in rows:
        if name == f"{info}/RECORD":
            assert digest == size == ""
            continue
        data = zf.read(name)
        want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert digest == f"sha256={want}" and int(size) == len(data), name
    assert {r[0] for r in rows} == set(zf.namelist())


def test_the_wheel_holds_the_declarations_the_modules_and_the_entry_point(tmp_path):
    ops = [write_op(tmp_path / "my_ops", OP.format(name="dbl"), "dbl.yaml")]
    prebuilt = tmp_path / "prebuilt" / "dbl-0123456789abcdef"
    prebuilt.mkdir(parents=True)
    (prebuilt / "meta.json").write_text("{}")
    dist, package = names_for(tmp_path / "my_ops", None)
    assert (dist, package) == ("my-ops", "my_ops")
    wheel = write_wheel(tmp_path / "dist", dist, "1.2", package, ops, prebuilt.parent, "dbl")
    assert wheel.name.startswith("my_ops-1.2-cp") and not wheel.name.endswith("-any.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        assert {"my_ops/__init__.py", "my_ops/operators/dbl.yaml",
                "my_ops/prebuilt/dbl-0123456789abcdef/meta.json"} <= names
        info = "my_ops-1.2.dist-info"
        assert zf.read(f"{info}/entry_points.txt").decode() == "[opkit.operators]\nmy_ops = my_ops\n"
        meta = zf.read(f"{info}/METADATA").decode()
        assert "Name: my-ops" in meta and "Requires-Dist: opkit==" in meta
        assert "Root-Is-Purelib: false" in zf.read(f"{info}/WHEEL").decode()
        _record_ok(zf, info)
    pure = write_wheel(tmp_path / "dist", dist, "1.2", package, ops, None, "dbl")
    assert pure.name == "my_ops-1.2-py3-none-any.whl"


@pytest.mark.parametrize("name, message", [("bad name!", "not a valid distribution name"),
                                           ("", "not a valid distribution name")])
def test_bad_package_names_are_refused(tmp_path, name, message):
    with pytest.raises(ValueError, match=message):
        names_for(tmp_path, name or "-")


def test_isa_choices():
    assert parse_isas("") == parse_isas("native") == ("native",)
    assert parse_isas("0") == parse_isas("none") == ()
    assert parse_isas("dist") == distribution_isas()
    assert parse_isas("portable,native") == ("portable", "native")
    assert "portable" in distribution_isas()
    with pytest.raises(ValueError, match="unknown ISA 'avx9'"):
        parse_isas("portable,avx9")


def test_the_runtime_falls_back_to_the_best_level_the_cpu_runs(monkeypatch):
    monkeypatch.setattr(target.platform, "machine", lambda: "x86_64")
    v3 = target.LEVELS["x86-64-v3"]["flags"]
    monkeypatch.setattr(target, "cpu_flags", lambda: tuple(v3))
    assert target.fallback_isas("native") == ("x86-64-v3", "portable")
    assert target.fallback_isas("portable") == ()
    monkeypatch.setattr(target, "cpu_flags", lambda: tuple(f for f in v3 if f != "f16c"))
    assert target.fallback_isas("native") == ("portable",)
    # a shipped -march=native module runs only where every flag of its CPU is there
    assert target.runs_here("native", ("avx2", "sse2")) and not target.runs_here("native", ("f16c",))
    monkeypatch.setattr(target.platform, "machine", lambda: "aarch64")
    assert target.fallback_isas("native") == ("portable",)


@pytest.mark.parametrize("built, running, ok", [
    ("2.1.0", "2.4.6", True), ("2.4.6", "2.4.6", True), ("2.5.0", "2.4.6", False),
    ("1.26.4", "2.0.0", False), ("2.0.0", "1.26.4", False), ("", "2.0", False)])
def test_numpy_compatibility_of_shipped_modules(built, running, ok):
    assert numpy_compatible(built, running) is ok


def test_loading_an_operators_own_file_again_keeps_its_origin(tmp_path):
    reg = Registry()
    pkg = _package(tmp_path, "alpha 1.0", "a1")
    reg.load_packages([pkg])
    reg.load(pkg.operators / "a1.yaml")  # opkit build PATH loads the file it builds
    assert reg.origin("a1") == "alpha 1.0"


def test_a_shipped_module_is_found_whatever_scipys_version():
    """The BLAS line of a module with fused calls names SciPy's version; the ship key leaves
    it out (cython_blas's functions are looked up by name at import), nothing else."""
    from opkit.builder import toolchain
    from opkit.builder.compile import ship_key
    tc = toolchain("portable")
    body = "# GEMM: SciPy {} BLAS (scipy.linalg.cython_blas sgemm/dgemm). Each call runs ...\nx = 1\n"
    key = ship_key("op", body.format("1.17.1"), {}, tc)
    assert ship_key("op", body.format("1.11.0"), {}, tc) == key
    assert ship_key("op", body.format("1.11.0") + "y = 2\n", {}, tc) != key


def test_aot_operators_are_picked_by_name():
    from opkit.packaging.aot import select

    class Op:
        def __init__(self, name):
            self.name = name
    ops = [Op("a"), Op("b"), Op("c")]
    assert select(ops, "") == ops and [o.name for o in select(ops, "c, a")] == ["c", "a"]
    with pytest.raises(ValueError, match="OPKIT_AOT_OPS names 'd', which is not a bundled "
                                         "operator; choose from a, b, c"):
        select(ops, "a,d")
