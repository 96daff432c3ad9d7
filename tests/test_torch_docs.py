"""The Python examples of docs/torch.md run as written."""
import doctest
import re

import pytest

torch = pytest.importorskip("torch")

# Inductor imports TorchScript modules that warn about their own deprecation
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")

from conftest import REPO  # noqa: E402
from torch_samples import compile_backend  # noqa: E402

BLOCKS = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "torch.md").read_text(), re.S)


def test_the_page_has_examples():
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("block", range(len(BLOCKS)))
def test_example_runs(block, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    text = BLOCKS[block]
    if text.lstrip().startswith(">>>"):
        test = doctest.DocTestParser().get_doctest(text, {}, f"docs/torch.md block {block}", None, 0)
        runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
        runner.run(test)
        assert runner.failures == 0
    else:
        if "torch.compile(" in text and compile_backend() != "inductor":
            pytest.skip("Inductor needs a C++ compiler")
        exec(compile(text, f"docs/torch.md block {block}", "exec"), {})
