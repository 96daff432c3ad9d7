"""The docs are tests: every YAML block and Python snippet of README.md and docs/*.md is checked,
built or run here, so a documented feature that does not work fails.

YAML blocks are of three kinds:
- an excerpt, whose first line names a bundled file in a comment (`# operators/x.yaml`): its
  lines must appear, in order, in that file;
- a complete declaration (a top-level `name:`): loaded as `opkit.load` loads a file, built,
  validated against the NumPy reference (which calls it in every dtype and layout);
- a fragment (some inputs, an attr, a `forward:` section ...): spliced into the small declaration
  FRAGMENTS gives for it, which must load (spec, graphs, lowering, the load-time checks).

Python blocks: `>>>` blocks run as doctests, a page's doctests as one session; other blocks
run in a fresh namespace and working directory after their entry in SETUP, and a ```text block
right after one is what it must print. docs/torch.md's Python is run by test_torch_docs.py.

Error messages shown in ```text blocks (`ops/x.yaml:6:33: ...`, `name(): ...`) must be what the
declaration or call ERRORS gives for each raises.
"""
from __future__ import annotations

import contextlib
import doctest
import importlib
import io
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import pytest

import opkit
from opkit.registry import REGISTRY, Registry
from opkit.spec import parse_spec
from opkit.validate import validate_op

from conftest import REPO

pytestmark = [
    # docs/deploy.md exports with torch.onnx.export(dynamo=False), which PyTorch warns is legacy
    pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript-based ONNX export"),
    pytest.mark.filterwarnings("ignore:The feature will be removed:DeprecationWarning"),
]

PAGES = ["README.md"] + sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md"))
FENCE = re.compile(r"^( *)```(\w*)\s*$")


@dataclass
class Block:
    file: str
    line: int                      # the line of the opening fence, 1-based
    lang: str
    lines: List[str]               # without the fence's indentation
    output: Optional["Block"] = None   # a ```text block right after it (blank lines between)

    @property
    def text(self) -> str:
        return "".join(line + "\n" for line in self.lines)

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


def extract(file: str) -> List[Block]:
    """The fenced blocks of a page, list-item indentation removed."""
    blocks: List[Block] = []
    lines = (REPO / file).read_text().splitlines()
    i = previous_end = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, start = len(m.group(1)), i
        body = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            text = lines[i]
            assert not text[:indent].strip(), f"{file}:{i + 1}: less indented than its fence"
            body.append(text[indent:])
            i += 1
        assert i < len(lines), f"{file}:{start + 1}: the block is never closed"
        block = Block(file, start + 1, m.group(2), body)
        if blocks and block.lang == "text" and not "".join(lines[previous_end + 1:start]).strip():
            blocks[-1].output = block
        blocks.append(block)
        previous_end = i
        i += 1
    return blocks


BLOCKS = [b for page in PAGES for b in extract(page)]
YAML = [b for b in BLOCKS if b.lang == "yaml"]
# docs/torch.md's Python runs in test_torch_docs.py (PyTorch's own setup and skips)
PYTHON = [b for b in BLOCKS if b.lang == "python" and b.file != "docs/torch.md"]


def entry(table: dict, block: Block):
    """The table entry for a block: keyed by (file, the block's first lines ...), as few lines as
    make the key unique."""
    found = [(k, v) for k, v in table.items()
             if k[0] == block.file and list(k[1:]) == block.lines[:len(k) - 1]]
    assert len(found) <= 1, f"{block}: several entries match; key it by more of its lines"
    return found[0][1] if found else None


def block_named(file: str, first_line: str) -> Block:
    """The block of `file` whose first line is `first_line` (the one such block)."""
    found = [b for b in BLOCKS if b.file == file and b.lines[:1] == [first_line]]
    assert len(found) == 1, f"{file}: {len(found)} blocks start with {first_line!r}"
    return found[0]


# ------------------------------------------------------------------------------------------ YAML

EXCERPT = re.compile(r"#\s*((?:operators|examples)/[\w/.-]+\.yaml)\s*$")


def uncommented(lines: List[str]) -> List[str]:
    """The lines without YAML comments and blank lines (no expression in the docs has `#`)."""
    out = [re.sub(r"(^|\s+)#.*$", "", line).rstrip() for line in lines]
    return [line for line in out if line]


# The tables below are keyed by (page, the block's first line), and by more of its first lines
# where blocks of a page share the first one.

# A fragment's declaration: FRAGMENT marks where its lines go, indented as the marker is.
FRAGMENT = "<fragment>"
XF = "x: {dtypes: [float32, float64]}"

FRAGMENTS: Dict[Tuple[str, ...], str] = {
    ("docs/spec.md", "x: {dtypes: [float16, float32, float64]}"): f"""
name: doc_dtypes
inputs:
  {FRAGMENT}
outputs:
  y: {{like: x}}
forward:
  y: 2 * x
""",
    ("docs/spec.md", "x: {dtypes: [float32], layouts: [NCHW, NHWC]}"): f"""
name: doc_layouts
inputs:
  {FRAGMENT}
outputs:
  y: {{like: x}}
forward:
  y: 2 * x
""",
    ("docs/spec.md", "x: {dtypes: [float32], shape: [N, K]}"): f"""
name: doc_shape
inputs:
  {FRAGMENT}
outputs:
  y: {{like: x}}
forward:
  y: x + bias
""",
    ("docs/spec.md", "mask: {dtypes: [float32], differentiable: false}"): f"""
name: doc_mask
inputs:
  x: {{dtypes: [float32]}}
  {FRAGMENT}
outputs:
  y: {{like: x}}
forward:
  y: x * mask
""",
    ("docs/spec.md", 'x: {dtypes: [float32, float64], domain: "(0, 4]"}'): f"""
name: doc_domain
inputs:
  {FRAGMENT}
outputs:
  y: {{like: x}}
forward:
  y: log(x) + sqrt(x)
""",
    ("docs/spec.md", "inputs:", "  x: {dtypes: [float16, float32, float64]}"): f"""
name: doc_optional
{FRAGMENT}
outputs:
  y: {{like: x}}
""",
    ("docs/spec.md", "attrs:", "  approximate: {type: str, choices: [none, tanh], default: none}"): f"""
name: doc_choices
inputs:
  {XF}
{FRAGMENT}
outputs:
  y: {{like: x}}
""",
    ("docs/spec.md", "alpha: {type: float, default: 0.2, range: [0.0, 1.0]}    # 0 <= alpha <= 1"): f"""
name: doc_ranges
inputs:
  {XF}
attrs:
  {FRAGMENT}
outputs:
  y: {{like: x}}
forward:
  y: min(where(x > 0, x, alpha * x), cap) * keep * steps
""",
    ("docs/spec.md", "scale: {type: float, default: null, null_means: 1.0}   # op(x) and op(x, scale=None) use 1.0"): f"""
name: doc_null_means
inputs:
  {XF}
attrs:
  {FRAGMENT}
outputs:
  y: {{like: x}}
forward:
  y: scale * x
""",
    ("docs/spec.md", "alpha: {type: float, default: 0.2, range: [0.0, 1.0], quantize: 7}   # 26 / 128 = 0.203125"): f"""
name: doc_quantize
inputs:
  x: {{dtypes: [float32, int8]}}
attrs:
  {FRAGMENT}
outputs:
  y: {{like: x}}
forward:
  y: where(x > 0, x, alpha * x)
""",
    ("docs/spec.md", "outputs:"): f"""
name: doc_outputs
inputs:
  {XF}
{FRAGMENT}
forward:
  y: 2 * x
""",
    ("docs/spec.md", "forward:", "  act: where(x > 0, x, alpha * x)    # a temporary"): f"""
name: doc_temporary
inputs:
  {XF}
  gain: {{dtypes: [float32, float64]}}
attrs:
  alpha: {{type: float, default: 0.2}}
outputs:
  y: {{like: x}}
{FRAGMENT}
""",
    # the hand-written backward is checked against the derived one when the file loads
    ("docs/spec.md", "forward:", "  act: where(x > 0, x, alpha * x)"): f"""
name: doc_backward
inputs:
  {XF}
  gain: {{dtypes: [float32, float64]}}
attrs:
  alpha: {{type: float, default: 0.2}}
outputs:
  y: {{like: x}}
{FRAGMENT}
""",
    ("docs/spec.md", "schedule:"): f"""
name: doc_schedule
inputs:
  {XF}
outputs:
  y: {{like: x}}
forward:
  y: where(x > 0, x, 0.2 * x)
{FRAGMENT}
""",
    ("docs/spec.md", "forward:", "  z: conv2d(x, w, stride, padding)"): f"""
name: doc_train_bn
inputs:
  x: {{dtypes: [float32, float64], layouts: [NCHW, NHWC]}}
  w: {{dtypes: [float32, float64], shape: [O, C, KH, KW]}}
  gamma: {{dtypes: [float32, float64], shape: [O]}}
  beta: {{dtypes: [float32, float64], shape: [O]}}
attrs:
  stride: {{type: int, default: 1}}
  padding: {{type: int, default: 0}}
  eps: {{type: float, default: 1e-5}}
outputs:
  y: {{}}
  batch_mean: {{}}
  batch_var: {{}}
{FRAGMENT}
""",
    ("docs/spec.md", "forward:", "  ex: exp(x - max(x, K))"): f"""
name: doc_softmax
inputs:
  x: {{dtypes: [float32, float64], shape: [N, K]}}
outputs:
  y: {{like: x}}
{FRAGMENT}
""",
    ("docs/precision.md", "attrs:"): f"""
name: doc_quantize_attr
inputs:
  x: {{dtypes: [float32, int8]}}
{FRAGMENT}
outputs:
  y: {{like: x}}
forward:
  y: where(x > 0, x, alpha * x)
""",
}


def splice(template: str, fragment: List[str]) -> str:
    out = []
    for line in template.lstrip("\n").splitlines():
        if line.strip() == FRAGMENT:
            indent = line[:line.index(FRAGMENT)]
            out += [indent + f if f.strip() else "" for f in fragment]
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def load_private(folder: Path, text: str, where: str) -> opkit.Op:
    """The operator of a declaration, loaded as opkit.load loads a file (parse, graphs, lowering
    and the load-time checks) but into a registry of its own, so that it may share a bundled
    operator's name. The file is NAME.yaml: the name is part of the build's cache key."""
    try:
        name = parse_spec(text, where).name
        path = folder / f"{name}.yaml"
        path.write_text(text)
        registry = Registry()
        assert registry.load(path) == [name]
    except opkit.SpecError as exc:
        numbered = "\n".join(f"{i:4}  {line}" for i, line in enumerate(text.splitlines(), 1))
        pytest.fail(f"{where}: {exc}\nin the declaration\n{numbered}", pytrace=False)
    return registry.get(name)


def test_the_docs_have_blocks():
    assert len(YAML) >= 15 and len(PYTHON) >= 10


def test_every_block_is_in_a_known_language():
    """A block in another spelling (```yml, ```py, ```pycon) would escape these tests."""
    for block in BLOCKS:
        assert block.lang in ("yaml", "python", "text", "bash", ""), f"{block}: ```{block.lang}"
        if block.lang == "":
            assert not block.lines or not block.lines[0].startswith((">>>", "name:", "import ")), \
                f"{block}: Python or YAML without a language is never run: mark it"


@pytest.mark.parametrize("block", YAML, ids=str)
def test_yaml_block(block, tmp_path):
    first = block.lines[0]
    excerpt = EXCERPT.search(first)
    if excerpt:
        source = REPO / excerpt.group(1)
        assert source.is_file(), f"{block}: names {excerpt.group(1)}, which does not exist"
        want, have = uncommented(block.lines), uncommented(source.read_text().splitlines())
        at = 0
        for line in want:
            assert line in have[at:], f"{block}: {line!r} is not in {source.name} (in this order)"
            at = have.index(line, at) + 1
        return
    if any(line.startswith("name:") for line in block.lines):
        op = load_private(tmp_path, block.text, str(block))
        bundled = REPO / "operators" / f"{op.name}.yaml"
        if bundled.is_file():
            # the docs show a bundled operator's declaration: it must be the file as it is
            assert block.text == bundled.read_text(), f"{block}: differs from {bundled.name}"
        op.build()
        report = validate_op(op)  # calls it in every dtype, layout and stride pattern
        assert report.ok, f"{block}:\n{report.format()}"
        assert any(c.what.startswith("forward") for c in report.checks)
        return
    template = entry(FRAGMENTS, block)
    if template is None:
        pytest.fail(f"{block}: a fragment with no declaration to check it in: add an entry "
                    f"keyed ({block.file!r}, {first!r}) to FRAGMENTS in tests/test_docs.py")
    load_private(tmp_path, splice(template, block.lines), f"{block} in its FRAGMENTS declaration")


# ---------------------------------------------------------------------------------------- Python

@dataclass
class Setup:
    code: str = ""                                   # run first, in the snippet's namespace
    # files written into the working directory: path -> (page, the first line of a block of it)
    files: Dict[str, Tuple[str, str]] = field(default_factory=dict)
    needs: Tuple[str, ...] = ()                      # optional packages (skipped without them)


LEAKY = """
import numpy as np, opkit
op = opkit.get("leaky_relu")
x = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)
dy = np.ones_like(x)
"""

SETUP: Dict[Tuple[str, ...], Setup] = {
    ("README.md", "import numpy as np, opkit", 'opkit.load("my_ops")'):
        Setup(files={"my_ops/soft_clip.yaml": ("README.md", "name: soft_clip")}),
    ("docs/operators.md", "y = opkit.ops.conv2d_bn_leaky_relu(x, w, gamma, beta, mean, var, padding=1, layout=\"NHWC\")"):
        Setup("""
import numpy as np, opkit
rng = np.random.default_rng(0)
x = rng.standard_normal((2, 3, 5, 3))           # C = 3 as NHWC (the first call) and as NCHW
w = rng.standard_normal((4, 3, 3, 3))
gamma, beta, mean = rng.standard_normal((3, 4))
var = rng.uniform(0.5, 2.0, 4)
dy = rng.standard_normal((2, 4, 5, 3))          # y of the NCHW training call
"""),
    ("docs/precision.md", 'opkit.configure(precision_mode="force_fp16")            # the whole process'):
        Setup(LEAKY),
    ("docs/precision.md", 'opkit.configure({"precision_mode": "force_fp16", "alpha_quant": True})'):
        Setup("import opkit"),
    ("docs/precision.md", "dx, = op.backward(dy, x, clip=0.1)"): Setup(LEAKY),
    ("docs/deploy.md", 'opkit.ops.gelu.to_onnx("gelu.onnx", [("N", 768)], {"approximate": "tanh"})'):
        Setup(f"""
import numpy as np, opkit
opkit.load({str(REPO / "examples" / "activations" / "gelu.yaml")!r})
opkit.load({str(REPO / "examples" / "activations" / "clip.yaml")!r})
x = np.linspace(-3, 3, 12, dtype=np.float32).reshape(3, 4)
lo = np.full(4, -1.0, np.float32)
""", needs=("onnx",)),
    ("docs/deploy.md", "import torch, opkit.torch"): Setup(needs=("torch", "onnx")),
}


def normalized(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A working directory, and the registry and settings as they were once the snippet ends."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(REGISTRY, "_ops", dict(REGISTRY._ops))
    monkeypatch.setattr(REGISTRY, "_origins", dict(REGISTRY._origins))
    settings = importlib.import_module("opkit.config").current()
    yield tmp_path
    opkit.configure(settings)


def is_doctest(block: Block) -> bool:
    return block.lines[0].startswith(">>>")


def run_doctests(block: Block) -> None:
    """A page's `>>>` blocks are one session: the earlier ones run first, unreported."""
    namespace: dict = {}
    earlier = [b for b in PYTHON if b.file == block.file and b.line < block.line and is_doctest(b)]
    for b in earlier + [block]:
        test = doctest.DocTestParser().get_doctest(b.text, namespace, str(b), b.file, b.line)
        report = io.StringIO()
        runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
        runner.run(test, out=report.write, clear_globs=False)
        namespace = test.globs
    assert runner.failures == 0, report.getvalue()


@pytest.mark.parametrize("block", PYTHON, ids=str)
def test_python_block(block, sandbox):
    if is_doctest(block):
        return run_doctests(block)
    setup = entry(SETUP, block) or Setup()
    for module in setup.needs:
        pytest.importorskip(module)
    for path, (page, first_line) in setup.files.items():
        (sandbox / path).parent.mkdir(parents=True, exist_ok=True)
        (sandbox / path).write_text(block_named(page, first_line).text)
    namespace: dict = {}
    exec(compile(setup.code, f"setup of {block}", "exec"), namespace)
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(block.text, str(block), "exec"), namespace)
    except NameError as exc:
        if entry(SETUP, block) is None:
            pytest.fail(f"{block}: {exc}: the snippet assumes names: add an entry keyed "
                        f"({block.file!r}, {block.lines[0]!r}) to SETUP in tests/test_docs.py")
        raise
    if block.output is not None:
        assert normalized(printed.getvalue()) == normalized(block.output.text), (
            f"{block} prints\n{printed.getvalue()}\nbut {block.output} shows\n{block.output.text}")


# ---------------------------------------------------------------------------- error messages

# A ```text line starting `ops/NAME.yaml:LINE:COL: ` shows opkit's error for a declaration, one
# starting `NAME(): ` its error for a call; the lines after it that start neither continue it.
MESSAGE = re.compile(r"^(ops/\w+\.yaml:\d+:\d+|\w+\(\)): ")


def messages(block: Block) -> List[List[str]]:
    found: List[List[str]] = []
    for line in block.lines:
        if MESSAGE.match(line):
            found.append([line])
        elif found and line.strip():
            found[-1].append(line)
    return found


SHOWN = [(b, m) for b in BLOCKS if b.lang == "text" for m in messages(b)]

# What raises each error the docs show: the declaration (written to the file the message names)
# or the call.
ERRORS: Dict[Tuple[str, str], str] = {
    ("docs/spec.md", "ops/x.yaml:2:1: the declaration: unknown key 'sumary'; did you mean 'summary'?"): """
name: t
sumary: LeakyReLU
inputs:
  x: {dtypes: [float32]}
outputs:
  y: {like: x}
forward:
  y: where(x > 0, x, 0.2 * x)
""",
    ("docs/spec.md", "ops/leaky.yaml:11:6: backward.x: the hand-written gradient disagrees with the one derived from forward: 0.15494 instead of 0.0774698 (ND one case); the derived gradient is where(x > 0, dy, dy * 0.25)"): """
name: leaky
summary: LeakyReLU with a slope of 0.25 and a hand-written backward.
inputs:
  x: {dtypes: [float32, float64]}
outputs:
  y: {like: x}
forward:
  y: where(x > 0, x, 0.25 * x)
backward:
  # the slope is wrong: 0.5 instead of 0.25
  x: where(x > 0, dy, 0.5 * dy)
""",
    ("docs/spec.md", "ops/x.yaml:6:33: attrs.alpha.default: 1.5 is outside the range [0.0, 1.0]"): """
name: t
summary: LeakyReLU
inputs:
  x: {dtypes: [float32]}
attrs:
  alpha: {type: float, default: 1.5, range: [0.0, 1.0]}
outputs:
  y: {like: x}
forward:
  y: where(x > 0, x, alpha * x)
""",
    ("docs/spec.md", "ops/x.yaml:4:25: inputs.x.dtypes: 'int64' is not one of: float16, float32, float64, bfloat16, int8, int16, int32"): """
name: t
summary: LeakyReLU
inputs:
  x: {dtypes: [float16, int64]}
outputs:
  y: {like: x}
forward:
  y: where(x > 0, x, 0.2 * x)
""",
    ("docs/spec.md", "ops/x.yaml:13:1: duplicate key 'name' (first given on line 1)"): """
name: t
summary: LeakyReLU
inputs:
  x: {dtypes: [float32]}
attrs:
  alpha: {type: float, default: 0.2}
outputs:
  y: {like: x}
forward:
  y: where(x > 0, x, alpha * x)
schedule:
  inplace: {y: x}
name: u
""",
    ("docs/spec.md", "ops/x.yaml:2:15: invalid YAML: mapping values are not allowed here"): """
name: t
summary: ReLU6: x clamped to 0..6
inputs:
  x: {dtypes: [float32]}
outputs:
  y: {like: x}
forward:
  y: min(max(x, 0), 6)
""",
    ("docs/spec.md", "ops/x.yaml:10:22: forward.y: undefined name 'alpa'; did you mean 'alpha'?"): """
name: t
summary: LeakyReLU
inputs:
  x: {dtypes: [float32]}
attrs:
  alpha: {type: float, default: 0.2}
outputs:
  y: {like: x}
forward:
  y: where(x > 0, x, alpa * x)
""",
    ("docs/precision.md", "ops/q.yaml:9:22: forward: int8 declared, but the float attr alpha is used in mul;"): """
name: q
inputs:
  x: {dtypes: [int8, float32]}
attrs:
  alpha: {type: float, default: 0.2, range: [0.0, 1.0]}
outputs:
  y: {like: x}
forward:
  y: where(x > 0, x, alpha * x)
""",
    ("docs/operators.md", "fused_bias_leaky_relu(): bias (shape (7,)) has size 7 along dim C but x (shape (2, 3, 5, 7)) has size 3 (sizes must match)"):
        "opkit.ops.fused_bias_leaky_relu(np.ones((2, 3, 5, 7)), np.ones(7))",
    ("docs/operators.md", "freq_leaky_relu(): up must be in [1, 16], got 0"):
        "opkit.ops.freq_leaky_relu(np.ones((1, 1, 4, 4)), up=0)",
    ("docs/operators.md", "fused_bias_leaky_relu(): clamp must be in (0.0, inf], got 0.0"):
        "opkit.ops.fused_bias_leaky_relu(np.ones((2, 3, 5, 7)), np.ones(3), clamp=0.0)",
    ("docs/operators.md", "conditional_leaky_relu(): layout NCHW needs x with 4 dims [N, C, H, W], got shape (3, 5, 7)"):
        "opkit.ops.conditional_leaky_relu(np.ones((3, 5, 7)), np.ones((3, 2)), np.ones((2, 5)), np.ones(5))",
}


@pytest.mark.parametrize("block, message", SHOWN, ids=[f"{b}:{m[0][:40]}" for b, m in SHOWN])
def test_error_message(block, message, sandbox):
    source = ERRORS.get((block.file, message[0]))
    if source is None:
        pytest.fail(f"{block}: nothing raises {message[0]!r}: add a declaration or a call keyed "
                    f"({block.file!r}, that line) to ERRORS in tests/test_docs.py")
    if message[0].startswith("ops/"):
        path = sandbox / message[0].split(":")[0]
        path.parent.mkdir(exist_ok=True)
        path.write_text(source.lstrip("\n"))
        with pytest.raises(opkit.SpecError) as raised:
            Registry().load(path.relative_to(sandbox))
    else:
        with pytest.raises((TypeError, ValueError)) as raised:
            exec(source, {"np": np, "opkit": opkit})
    got = str(raised.value)
    if "\n" in got:  # a caret under an expression: every column counts
        assert [line.rstrip() for line in message] == got.splitlines(), got
    else:  # a long message may be wrapped in the docs
        assert normalized("\n".join(message)) == got, got


# ---------------------------------------------------------------------------------- the tables

def test_every_table_entry_is_a_block():
    """An entry whose block was edited away would check nothing."""
    for table in (FRAGMENTS, SETUP):
        for key in table:
            matches = [b for b in BLOCKS if entry({key: True}, b)]
            assert len(matches) == 1, f"{key}: matches {len(matches)} blocks"
    shown = {(b.file, m[0]) for b, m in SHOWN}
    assert not set(ERRORS) - shown, f"no longer in the docs: {sorted(set(ERRORS) - shown)}"
    for setup in SETUP.values():
        for page, first_line in setup.files.values():
            block_named(page, first_line)


def test_torch_page_python_runs_in_test_torch_docs():
    source = (REPO / "tests" / "test_torch_docs.py").read_text()
    assert '"docs" / "torch.md"' in source
    page = [b for b in BLOCKS if b.file == "docs/torch.md"]
    python = [b for b in page if b.lang == "python"]
    # test_torch_docs.py takes the blocks with this pattern: it must see each one, unindented
    found = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "torch.md").read_text(), re.S)
    assert [b.text for b in python] == found
