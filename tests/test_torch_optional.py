"""PyTorch is an optional extra: without it opkit works and `import opkit.torch` says what to
install (this runs with or without PyTorch installed: the child process cannot import it)."""
import os
import subprocess
import sys

from conftest import REPO

NO_TORCH = "import sys; sys.modules['torch'] = None  # every `import torch` fails\n"


def _python(code):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-c", NO_TORCH + code], capture_output=True, text=True,
                          env=env, timeout=300)


def test_opkit_works_without_torch():
    r = _python("import numpy as np, opkit\n"
                "print(opkit.ops.leaky_relu(np.array([-1.0, 2.0])).tolist())")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[-0.2, 2.0]"


def test_opkit_torch_without_torch_says_what_to_install():
    r = _python("import opkit.torch")
    assert r.returncode != 0
    assert "ImportError: opkit.torch needs PyTorch: pip install 'opkit[torch]'" in r.stderr
