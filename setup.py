"""Build opkit; the build step also compiles the bundled operators' kernels ahead of time.

The metadata is in pyproject.toml. After the package is copied into the build folder, the
bundled operators are compiled there (into opkit/prebuilt), so an installed opkit runs them
with no compiler and `opkit build` finds every one in place. OPKIT_AOT chooses what for:

    native (the default)  this machine's CPU: a local `pip install .`
    dist                  portable and, on x86-64, x86-64-v3: a wheel for other machines
    0                     nothing (the kernels compile on first use); editable installs never
                          build ahead of time
    a list                portable,x86-64-v3,native ...

OPKIT_AOT_OPS (comma-separated names) builds only those bundled operators ahead of time.

docs/deploy.md describes the policy and what each choice guarantees.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution


def _aot() -> str:
    return os.environ.get("OPKIT_AOT", "native").strip() or "native"


class BuildPyAheadOfTime(build_py):
    """build_py, then the bundled operators' kernels compiled into the built package."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False) or _aot().lower() in ("0", "none"):
            return
        out = Path(self.build_lib, "opkit", "prebuilt")
        shutil.rmtree(out, ignore_errors=True)  # the modules of an earlier build with other ISAs
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            filter(None, [os.path.abspath(self.build_lib), os.environ.get("PYTHONPATH")])))
        env.pop("OPKIT_PATH", None)  # the bundled operators only
        subprocess.run([sys.executable, "-m", "opkit.packaging.aot", "--out", str(out),
                        "--isa", _aot(), "--ops", os.environ.get("OPKIT_AOT_OPS", "")],
                       env=env, check=True)


class PlatformDistribution(Distribution):
    """Compiled modules inside: a wheel tagged for this interpreter and platform."""

    def has_ext_modules(self):
        return _aot().lower() not in ("0", "none")


setup(cmdclass={"build_py": BuildPyAheadOfTime}, distclass=PlatformDistribution)
