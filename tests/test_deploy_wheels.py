"""End to end, once: opkit's own wheel with kernels built ahead of time (setup.py's build step)
and an operator package made by `opkit package`, both installed into a fresh folder and used by
a process that has no C compiler. Both wheels are built for `portable` only (one compile per
operator, the cheapest), so the process, asking for native as it does by default, also shows
the fallback to the best shipped module this CPU runs; opkit's wheel carries two bundled
operators (OPKIT_AOT_OPS), one with a fused convolution on the generated GEMM."""
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, source_copy, write_op

# the module's tests on one worker: its fixture builds the wheels once
pytestmark = [pytest.mark.xdist_group("deploy_wheels"), pytest.mark.slow]

USER_OP = textwrap.dedent("""\
    name: softsign_gain
    summary: y = gain * x / (1 + |x|)
    inputs:
      x: {dtypes: [float16, float32, float64], layouts: [ND, NCHW, NHWC]}
    attrs:
      gain: {type: float, default: 2.0, range: "[0, inf)"}
    outputs:
      y: {like: x}
    forward:
      y: gain * x / (1 + abs(x))
    """)


SHIPPED = ("leaky_relu", "conv2d_bias_leaky_relu")


def _run(cmd, env=None, cwd=None, timeout=900):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
    assert r.returncode == 0, f"{cmd}\n{r.stdout}\n{r.stderr}"
    return r


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(site folder, environment without a compiler, the wheels)."""
    root = tmp_path_factory.mktemp("deploy")
    dist = root / "dist"
    # the isolated build environment gets this process's NumPy: shipped modules run on the
    # NumPy they were compiled against or a newer one of the same major version
    constraints = root / "constraints.txt"
    constraints.write_text(f"numpy=={np.__version__}\n")
    env = dict(os.environ, OPKIT_AOT="portable", OPKIT_AOT_OPS=",".join(SHIPPED),
               PIP_CONSTRAINT=str(constraints))
    env.pop("OPKIT_PATH", None)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(source_copy(root))],
         env=env)
    ops = root / "my_ops"
    write_op(ops, USER_OP, "softsign_gain.yaml")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    _run([sys.executable, "-m", "opkit", "package", str(ops), "-o", str(dist), "--isa",
          "portable", "--name", "my-ops", "--version", "1.0"], env=env, cwd=str(root))
    wheels = sorted(dist.glob("*.whl"))
    site = root / "site"
    _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
          *map(str, wheels)])
    empty = root / "bin-without-cc"
    empty.mkdir()
    bare = {k: v for k, v in os.environ.items()
            if k not in ("CC", "OPKIT_PATH", "PYTHONPATH", "OPKIT_PREBUILT")}
    bare.update(PATH=str(empty), PYTHONPATH=str(site), OPKIT_CACHE_DIR=str(root / "cache"))
    return site, bare, wheels


def test_the_wheels_hold_their_kernels(installed):
    site, _, wheels = installed
    opkit_wheel = next(w for w in wheels if w.name.startswith("opkit-"))
    assert "-cp" in opkit_wheel.name and not opkit_wheel.name.endswith("-any.whl")
    names = zipfile.ZipFile(opkit_wheel).namelist()
    shipped = sorted(n.split("/")[2].rsplit("-", 1)[0] for n in names
                     if n.startswith("opkit/prebuilt/") and n.endswith("meta.json"))
    # the fused convolution runs on the generated GEMM, whether SciPy is installed or not: one build
    assert shipped == ["conv2d_bias_leaky_relu", "leaky_relu"]
    assert not any(n.endswith(".c") for n in names)
    mine = next(w for w in wheels if w.name.startswith("my_ops-1.0-"))
    names = zipfile.ZipFile(mine).namelist()
    assert "my_ops/operators/softsign_gain.yaml" in names
    assert any(n.startswith("my_ops/prebuilt/softsign_gain-") and n.endswith(".so") for n in names)


def test_without_a_compiler_the_installed_operators_run(installed, tmp_path):
    site, bare, _ = installed
    script = textwrap.dedent("""\
        import numpy as np, opkit
        from opkit.builder import toolchain
        from opkit.registry import REGISTRY
        print(toolchain().available)
        print(opkit.__file__)
        x = np.array([-3.0, -0.5, 0.0, 2.0], np.float32)
        print(opkit.ops.softsign_gain(x, gain=3.0).tolist())
        print(opkit.ops.leaky_relu(x).tolist())
        rng = np.random.default_rng(0)
        xc, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((2, 3, 6, 5), (4, 3, 3, 3), (4,)))
        np.save("conv.npy", opkit.ops.conv2d_bias_leaky_relu(xc, w, b, padding=1, alpha=0.1))
        for name in ("softsign_gain", "leaky_relu"):
            result = opkit.get(name).build()
            print(name, REGISTRY.origin(name), result.cached, result.meta["toolchain"]["isa"],
                  result.entry)
        """)
    r = _run([sys.executable, "-c", script], env=bare, cwd=str(tmp_path))
    lines = r.stdout.splitlines()
    assert lines[0] == "False", "the process must not find a compiler"
    assert lines[1].startswith(str(site))
    x = np.array([-3.0, -0.5, 0.0, 2.0], np.float32)
    np.testing.assert_allclose(eval(lines[2]), 3.0 * x / (1 + np.abs(x)), rtol=1e-6)
    assert eval(lines[3]) == pytest.approx([-0.6, -0.1, 0.0, 2.0])
    for line, origin in zip(lines[4:], ("my-ops 1.0", "opkit")):
        name, *who, cached, isa, entry = line.split()
        assert " ".join(who) == origin and cached == "True" and isa == "portable"
        assert entry.startswith(str(site)), entry
    assert r.stderr == ""
    rng = np.random.default_rng(0)  # the script's inputs
    want = _conv_leaky(*(rng.standard_normal(s).astype(np.float32)
                         for s in ((2, 3, 6, 5), (4, 3, 3, 3), (4,))))
    np.testing.assert_allclose(np.load(tmp_path / "conv.npy"), want, rtol=1e-5, atol=1e-5)


def _conv_leaky(x, w, b, alpha=0.1):
    """The direct sum of a 3x3 convolution with padding 1, bias and LeakyReLU, in float64."""
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    h, wd = x.shape[2:]
    z = sum(np.einsum("nchw,oc->nohw", xp[:, :, i:i + h, j:j + wd], w[:, :, i, j].astype(np.float64))
            for i in range(3) for j in range(3)) + b[:, None, None]
    return np.where(z > 0, z, alpha * z)


def test_without_a_compiler_opkit_build_is_all_hits_and_list_names_the_packages(installed, tmp_path):
    site, bare, _ = installed
    files = [site / "opkit" / "operators" / f"{n}.yaml" for n in SHIPPED]
    files.append(site / "my_ops" / "operators" / "softsign_gain.yaml")
    r = _run([sys.executable, "-m", "opkit", "build", "-q", "--no-validate", *map(str, files)],
             env=bare, cwd=str(tmp_path))
    rows = [line.split() for line in r.stdout.splitlines()[2:] if line and not line[0].isdigit()]
    assert len(rows) == 3 and all(row[-3] == "hit" for row in rows), r.stdout
    r = _run([sys.executable, "-m", "opkit", "list"], env=bare, cwd=str(tmp_path))
    row = next(line for line in r.stdout.splitlines() if line.startswith("softsign_gain"))
    assert "my-ops 1.0" in row
    cache = Path(bare["OPKIT_CACHE_DIR"])
    assert not cache.exists() or not any(cache.iterdir()), "nothing was built or written"
