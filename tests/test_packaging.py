"""A non-editable install carries its templates and bundled operators and works from anywhere."""
import os
import subprocess
import sys
import zipfile

import pytest

from conftest import source_copy

# the module's tests on one worker: its fixture builds the wheels once
pytestmark = [pytest.mark.xdist_group("packaging"), pytest.mark.slow]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    # OPKIT_AOT=0: the package alone (tests/test_deploy_wheels.py builds one with kernels)
    src = source_copy(tmp_path_factory.mktemp("src"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
                       capture_output=True, text=True, timeout=600, env=dict(os.environ, OPKIT_AOT="0"))
    assert r.returncode == 0, r.stderr
    wheels = list(out.glob("opkit-*.whl"))
    assert len(wheels) == 1
    return wheels[0]


def test_wheel_contents(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    for needed in ("opkit/templates/module.pyx.j2", "opkit/templates/opkit_kernel.h",
                   "opkit/operators/leaky_relu.yaml", "opkit/cli.py", "opkit/spec/load.py",
                   "opkit/torch/__init__.py", "opkit/torch/nn.py"):
        assert needed in names, needed
    assert not any(n.endswith((".so", ".c", ".pyx")) for n in names)
    entry = [n for n in names if n.endswith("entry_points.txt")]
    assert entry and "opkit = opkit.cli:main" in zipfile.ZipFile(wheel).read(entry[0]).decode()


def test_installed_wheel_runs_from_another_directory(wheel, tmp_path):
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                        str(target), str(wheel)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    code = ("import numpy as np, opkit, opkit._paths as p; print(opkit.__file__); "
            "print(p.templates_dir()); print(p.operators_dir()); "
            "print(opkit.ops.leaky_relu(np.array([-1.0, 1.0])).tolist())")
    env = dict(os.environ, OPKIT_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(target))
    work = tmp_path / "elsewhere"
    work.mkdir()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(work),
                       env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    module, templates, operators, values = r.stdout.splitlines()
    for path in (module, templates, operators):
        assert path.startswith(str(target)), path
    assert values == "[-0.2, 1.0]"
    r = subprocess.run([sys.executable, "-m", "opkit", "list"], capture_output=True, text=True,
                       cwd=str(work), env=env, timeout=300)
    assert r.returncode == 0 and "leaky_relu" in r.stdout
