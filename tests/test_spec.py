"""The declaration loader (opkit.spec) and the expression stage (opkit.dsl): every SpecError.

Each error test starts from one small valid declaration (BASE), changes one thing, and checks
that the exception is opkit.SpecError, that its message starts with `file:line:` pointing at the
offending line (found in the text, not hard-coded), and that it says what was expected.
"""
from __future__ import annotations

import ast
import dataclasses
import math
from pathlib import Path

import pytest

import opkit
from opkit import SpecError
from opkit._paths import operators_dir
from opkit.dsl import build_graphs
from opkit.registry import make_op
from opkit.spec import Interval, load_spec, parse_spec

FILE = "ops/x.yaml"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "user_ops"

BASE = """\
name: demo
summary: A small valid operator; every test changes one thing in it.
inputs:
  x: {dtypes: [float32, float64], layouts: [ND, NCHW, NHWC]}
attrs:
  alpha: {type: float, default: 0.5, range: [0.0, 1.0]}
outputs:
  y: {like: x}
forward:
  y: where(x > 0, x, alpha * x)
schedule:
  inplace: {y: x}
"""

X_LINE = "  x: {dtypes: [float32, float64], layouts: [ND, NCHW, NHWC]}"
ALPHA_LINE = "  alpha: {type: float, default: 0.5, range: [0.0, 1.0]}"
Y_FORWARD = "  y: where(x > 0, x, alpha * x)"


# ----------------------------------------------------------------------------------- helpers

def decl(*edits, append: str = "") -> str:
    """BASE with each (old, new) replacement made (old must occur exactly once), plus `append`."""
    text = BASE
    for old, new in edits:
        assert text.count(old) == 1, f"{old!r} is not unique in the base declaration"
        text = text.replace(old, new)
    return text + append


def line_of(text: str, needle: str, nth: int = 1) -> int:
    """1-based number of the nth line containing `needle`."""
    hits = [i for i, line in enumerate(text.splitlines(), 1) if needle in line]
    assert len(hits) >= nth, f"{needle!r} occurs on {len(hits)} lines"
    return hits[nth - 1]


def col_of(text: str, needle: str, nth: int = 1) -> int:
    """1-based column where `needle` starts on the nth line containing it."""
    line = text.splitlines()[line_of(text, needle, nth) - 1]
    return line.index(needle) + 1


def col_in(text: str, line_needle: str, token: str) -> int:
    """1-based column of `token` on the line containing `line_needle`."""
    line = text.splitlines()[line_of(text, line_needle) - 1]
    return line.index(token) + 1


def load_error(text: str) -> SpecError:
    with pytest.raises(SpecError) as info:
        parse_spec(text, FILE)
    return info.value


def dsl_error(text: str) -> SpecError:
    spec = parse_spec(text, FILE)  # the declaration itself is fine
    with pytest.raises(SpecError) as info:
        build_graphs(spec)
    return info.value


def check(err: SpecError, line: int, *fragments: str, col: int = None, file: str = FILE) -> str:
    """The message names file:line (and :col), and contains every fragment. Returns it."""
    assert isinstance(err, SpecError) and isinstance(err, ValueError)
    message = str(err)
    head = message.splitlines()[0]
    where = f"{file}:{line}:" if col is None else f"{file}:{line}:{col}: "
    assert head.startswith(where), f"expected the message to start with {where!r}: {message}"
    assert err.loc is not None and err.loc.file == file and err.loc.line == line
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in: {message}"
    return message


def caret(err: SpecError):
    """(expression line, caret column) of an expression error's excerpt."""
    lines = str(err).splitlines()
    assert len(lines) >= 3, str(err)
    expr_line, caret_line = lines[-2], lines[-1]
    assert caret_line.strip() == "^", str(err)
    assert expr_line.startswith("    ") and caret_line.startswith("    ")
    return expr_line[4:], caret_line.index("^") - 4


def test_base_declaration_is_valid():
    spec = parse_spec(BASE, FILE)
    graphs = build_graphs(spec)
    assert spec.name == "demo" and graphs.differentiable == ("x",)
    for needle in (X_LINE, ALPHA_LINE, Y_FORWARD):
        assert needle in BASE


def test_spec_error_is_a_value_error():
    assert opkit.SpecError is SpecError
    assert issubclass(SpecError, ValueError)
    err = load_error(decl(("name: demo", "name: Demo")))
    assert isinstance(err, ValueError)
    assert err.reason.startswith("name: ")
    assert str(err) == f"{FILE}:1:7: {err.reason}"


# ----------------------------------------------------------------------- unknown, duplicate keys

def test_unknown_top_level_key_suggests_a_close_match():
    text = decl(append="sumary: typo of summary\n")
    check(load_error(text), line_of(text, "sumary"),
          "the declaration: unknown key 'sumary'; did you mean 'summary'?")


def test_unknown_top_level_key_without_close_match_lists_the_keys():
    text = decl(append="colour: blue\n")
    check(load_error(text), line_of(text, "colour"), "unknown key 'colour'",
          "expected one of: name, summary, inputs, attrs, outputs, forward, backward, schedule")


@pytest.mark.parametrize("old, new, needle, expected", [
    (X_LINE, "  x: {dtypes: [float32], layout: [NCHW]}", "layout:",
     "inputs.x: unknown key 'layout'; did you mean 'layouts'?"),
    (ALPHA_LINE, "  alpha: {type: float, defualt: 0.5}", "defualt",
     "attrs.alpha: unknown key 'defualt'; did you mean 'default'?"),
    ("  y: {like: x}", "  y: {lke: x}", "lke",
     "outputs.y: unknown key 'lke'; did you mean 'like'?"),
    ("  inplace: {y: x}", "  inplce: {y: x}", "inplce",
     "schedule: unknown key 'inplce'; did you mean 'inplace'?"),
    ("  inplace: {y: x}", "  tiles: 64", "tiles",
     "schedule: unknown key 'tiles'; did you mean 'tile'?"),
], ids=["input", "attr", "output", "schedule-inplace", "schedule-tile"])
def test_unknown_key_inside_a_section(old, new, needle, expected):
    text = decl((old, new))
    check(load_error(text), line_of(text, needle), expected)


def test_unknown_key_in_an_input_lists_the_allowed_keys():
    text = decl((X_LINE, "  x: {dtypes: [float32], colour: red}"))
    check(load_error(text), line_of(text, "colour"),
          "expected one of: dtypes, layouts, shape, differentiable, domain")


def test_duplicate_top_level_key_names_the_first_line():
    text = decl(append="name: other\n")
    first, second = line_of(text, "name:", 1), line_of(text, "name:", 2)
    check(load_error(text), second, f"duplicate key 'name' (first given on line {first})", col=1)


def test_duplicate_input_names_the_first_line():
    text = decl((X_LINE, X_LINE + "\n  x: {dtypes: [float32]}"))
    first = line_of(text, "  x: {dtypes")
    second = line_of(text, "  x: {dtypes", 2)
    check(load_error(text), second, f"duplicate key 'x' (first given on line {first})")


def test_duplicate_forward_line():
    text = decl((Y_FORWARD, Y_FORWARD + "\n  y: x"))
    check(load_error(text), line_of(text, "  y: x"),
          f"duplicate key 'y' (first given on line {line_of(text, Y_FORWARD)})")


def test_duplicate_key_inside_a_flow_mapping():
    text = decl((ALPHA_LINE, "  alpha: {type: float, type: int}"))
    check(load_error(text), line_of(text, "type: int"),
          f"duplicate key 'type' (first given on line {line_of(text, 'type: int')})")


# ------------------------------------------------------------------------------- wrong types

@pytest.mark.parametrize("old, new, needle, expected", [
    ("inputs:\n" + X_LINE, "inputs: x", "inputs: x",
     "inputs: expected a mapping of keys, got a string ('x')"),
    (X_LINE, "  x: {dtypes: float32}", "dtypes: float32",
     "inputs.x.dtypes: expected a list, got a string ('float32')"),
    (X_LINE, "  x: float32", "x: float32",
     "inputs.x: expected a mapping of keys, got a string ('float32')"),
    (ALPHA_LINE, "  alpha: 0.5", "alpha: 0.5",
     "attrs.alpha: expected a mapping of keys, got a number (0.5)"),
    (ALPHA_LINE, "  alpha: {type: float, default: half}", "half",
     "attrs.alpha.default: expected a number, got a string ('half')"),
    (ALPHA_LINE, "  alpha: {type: float, default: '0.5'}", "'0.5'",
     "attrs.alpha.default: expected a number, got a string ('0.5')"),
    (ALPHA_LINE, "  alpha: {type: int, default: 1.5}", "1.5",
     "attrs.alpha.default: expected an integer, got a number (1.5)"),
    (ALPHA_LINE, "  alpha: {type: float, range: wide}", "wide",
     "attrs.alpha.range: expected [low, high] or an interval such as \"(0, inf]\", "
     "got a string ('wide')"),
    (ALPHA_LINE, "  alpha: {type: float, range: [0, 1, 2]}", "range",
     "attrs.alpha.range: expected [low, high], got a list of 3"),
    (ALPHA_LINE, "  alpha: {type: float, range: [0, one]}", "[0, one]",
     "attrs.alpha.range: expected a number, got a string ('one')"),
    ("  y: {like: x}", "  y: [x]", "y: [x]", "outputs.y: expected a mapping of keys, got a list"),
    ("  y: {like: x}", "  y: {like: 3}", "like: 3",
     "outputs.y.like: expected a string, got an integer (3)"),
    ("forward:\n" + Y_FORWARD, "forward: [y]", "forward: [y]",
     "forward: expected a mapping of keys, got a list"),
    ("summary: A small valid operator; every test changes one thing in it.", "summary: [a, list]",
     "summary:", "summary: expected a string, got a list"),
    ("name: demo", "name: 3", "name: 3", "name: expected a string, got an integer (3)"),
    ("  inplace: {y: x}", "  tile: '64'", "tile",
     "schedule.tile: expected an integer, got a string ('64')"),
    ("  inplace: {y: x}", "  tile: 64.0", "tile",
     "schedule.tile: expected an integer, got a number (64.0)"),
    ("schedule:\n  inplace: {y: x}", "schedule: fast", "schedule: fast",
     "schedule: expected a mapping of keys, got a string ('fast')"),
    ("  inplace: {y: x}", "  inplace: {y: 3}", "inplace",
     "schedule.inplace.y: expected a string, got an integer (3)"),
], ids=["inputs-string", "dtypes-string", "input-string", "attr-number", "default-word",
        "default-quoted", "int-default-float", "range-word", "range-three-items", "range-item-word",
        "output-list", "like-integer", "forward-list", "summary-list", "name-integer", "tile-quoted",
        "tile-float", "schedule-word", "inplace-integer"])
def test_wrong_type(old, new, needle, expected):
    text = decl((old, new))
    check(load_error(text), line_of(text, needle), expected)


def test_wrong_type_column_points_at_the_value():
    text = decl((X_LINE, "  x: {dtypes: float32}"))
    check(load_error(text), line_of(text, "float32"), col=col_of(text, "float32"))


def test_whole_file_must_be_a_mapping():
    check(load_error("[name, demo]\n"), 1,
          "the declaration: expected a mapping of keys, got a list", col=1)
    check(load_error("just words\n"), 1,
          "the declaration: expected a mapping of keys, got a string ('just words')")


def test_forward_value_must_be_an_expression():
    text = decl((Y_FORWARD, "  y: true"))
    check(load_error(text), line_of(text, "y: true"),
          "forward.y: expected an expression, got true or false (True)")
    text = decl((Y_FORWARD, "  y:"))
    check(load_error(text), line_of(text, "  y:", 2), "forward.y: expected an expression, got nothing")


def test_mapping_key_must_be_a_plain_name():
    text = decl(append="? [a, b]\n: 1\n")
    check(load_error(text), line_of(text, "? [a, b]"), "a mapping key must be a plain name")


# ------------------------------------------------------------------------------------- names

@pytest.mark.parametrize("name", ["LeakyRelu", "Demo", "1demo", "leaky-relu", "_demo", "demo op"])
def test_bad_operator_name(name):
    text = decl(("name: demo", f"name: {name}"))
    check(load_error(text), line_of(text, "name:"),
          f"name: {name!r} is not allowed; use lower-case letters, digits and underscores, "
          "starting with a letter", col=len("name: ") + 1)


def test_operator_name_length_limit():
    ok = "a" * 64
    assert parse_spec(decl(("name: demo", f"name: {ok}")), FILE).name == ok
    text = decl(("name: demo", f"name: {ok}a"))
    check(load_error(text), 1, "is not allowed")


BAD_IDENTIFIERS = ['"a b"', "class", "lambda", "_x", "2x", '"x-y"', "a" * 65]


@pytest.mark.parametrize("bad", BAD_IDENTIFIERS)
def test_bad_input_name(bad):
    text = decl(("inputs:\n", f"inputs:\n  {bad}: {{dtypes: [float32]}}\n"))
    shown = bad.strip('"')
    check(load_error(text), line_of(text, f"{bad}:"),
          f"inputs: name {shown!r} is not allowed; use letters, digits and underscores, "
          "starting with a letter (at most 64 characters, not a Python keyword)")


@pytest.mark.parametrize("bad", BAD_IDENTIFIERS)
def test_bad_attr_name(bad):
    text = decl(("attrs:\n", f"attrs:\n  {bad}: {{type: float, default: 1.0}}\n"))
    check(load_error(text), line_of(text, f"{bad}:"),
          f"attrs: name {bad.strip(chr(34))!r} is not allowed; use letters, digits and underscores, "
          "starting with a letter (at most 64 characters, not a Python keyword)")


@pytest.mark.parametrize("bad", BAD_IDENTIFIERS)
def test_bad_output_name(bad):
    text = decl(("outputs:\n", f"outputs:\n  {bad}: {{like: x}}\n"))
    check(load_error(text), line_of(text, f"{bad}:"),
          f"outputs: name {bad.strip(chr(34))!r} is not allowed; use letters, digits and underscores, "
          "starting with a letter (at most 64 characters, not a Python keyword)")


@pytest.mark.parametrize("bad", ['"a b"', "if", "_t"])
def test_bad_forward_name(bad):
    text = decl((Y_FORWARD, f"  {bad}: x * 2\n" + Y_FORWARD))
    check(load_error(text), line_of(text, f"{bad}:"),
          f"forward: name {bad.strip(chr(34))!r} is not allowed; use letters, digits and underscores, "
          "starting with a letter (at most 64 characters, not a Python keyword)")


@pytest.mark.parametrize("reserved", ["out", "layout", "backward", "name"])
@pytest.mark.parametrize("section, body", [
    ("inputs", "{dtypes: [float32]}"),
    ("attrs", "{type: float, default: 1.0}"),
    ("outputs", "{like: x}"),
])
def test_reserved_names(reserved, section, body):
    text = decl((f"{section}:\n", f"{section}:\n  {reserved}: {body}\n"))
    check(load_error(text), line_of(text, f"  {reserved}: {body}"),
          f"{section}: {reserved!r} is reserved for a call keyword; pick another name")


@pytest.mark.parametrize("edit, needle, expected", [
    ((ALPHA_LINE, ALPHA_LINE + "\n  x: {type: float, default: 1.0}"), "x: {type",
     "attrs: 'x' is already used as an input"),
    (("  y: {like: x}", "  y: {like: x}\n  alpha: {like: x}"), "alpha: {like",
     "outputs: 'alpha' is already used as an attr"),
    (("  y: {like: x}", "  y: {like: x}\n  x: {like: x}"), "  x: {like",
     "outputs: 'x' is already used as an input"),
    # names may not differ only in case: generated code and keyword lookups would clash
    ((ALPHA_LINE, ALPHA_LINE + "\n  X: {type: float, default: 1.0}"), "X: {type",
     "attrs: 'X' is already used as an input"),
    # inputs are read first, so the attr is the one reported
    ((X_LINE, X_LINE + "\n  Alpha: {dtypes: [float32]}"), ALPHA_LINE,
     "attrs: 'alpha' is already used as an input"),
], ids=["attr-named-like-input", "output-named-like-attr", "output-named-like-input",
        "attr-differs-in-case", "input-differs-in-case"])
def test_same_name_in_two_sections(edit, needle, expected):
    text = decl(edit)
    check(load_error(text), line_of(text, needle), expected)


def test_gradient_name_clash_with_an_input():
    text = decl((X_LINE, X_LINE + "\n  dy: {dtypes: [float32, float64]}"))
    check(load_error(text), line_of(text, "y: {like: x}"),
          "outputs.y: its gradient is called 'dy' in backward expressions, which is already an input")


def test_gradient_name_clash_with_an_attr():
    text = decl((ALPHA_LINE, ALPHA_LINE + "\n  dy: {type: float, default: 1.0}"))
    check(load_error(text), line_of(text, "y: {like: x}"),
          "its gradient is called 'dy' in backward expressions, which is already an attr")


# ------------------------------------------------------------------------------------ inputs

def test_unknown_dtype():
    text = decl((X_LINE, "  x: {dtypes: [float32, complex64]}"))
    check(load_error(text), line_of(text, "complex64"),
          "inputs.x.dtypes: 'complex64' is not one of: float16, float32, float64, bfloat16",
          col=col_of(text, "complex64"))


def test_unknown_layout():
    text = decl((X_LINE, "  x: {dtypes: [float32], layouts: [NCHW, NCWH]}"))
    check(load_error(text), line_of(text, "NCWH"),
          "inputs.x.layouts: 'NCWH' is not one of: ND, NCHW, NHWC", col=col_of(text, "NCWH"))


def test_repeated_dtype():
    text = decl((X_LINE, "  x: {dtypes: [float32, float64, float32]}"))
    err = load_error(text)
    check(err, line_of(text, "float32]"), "inputs.x.dtypes: 'float32' is listed twice")
    assert err.loc.col == text.splitlines()[err.loc.line - 1].rindex("float32") + 1


def test_repeated_layout():
    text = decl((X_LINE, "  x: {dtypes: [float32], layouts: [NCHW, NCHW]}"))
    check(load_error(text), line_of(text, "NCHW, NCHW"), "inputs.x.layouts: 'NCHW' is listed twice")


def test_empty_dtypes():
    text = decl((X_LINE, "  x: {dtypes: []}"))
    check(load_error(text), line_of(text, "dtypes: []"),
          "inputs.x.dtypes: the list is empty; give at least one of: float16, float32",
          col=col_of(text, "[]"))


def test_missing_dtypes():
    text = decl((X_LINE, "  x: {layouts: [ND]}"))
    check(load_error(text), line_of(text, "x: {layouts"), "inputs.x: missing required key 'dtypes'")


def test_shape_with_a_4d_layout():
    text = decl((X_LINE, "  x: {dtypes: [float32], layouts: [NCHW, NHWC], shape: [N, K]}"))
    check(load_error(text), line_of(text, "shape"),
          "inputs.x: give either shape or a 4-d layout list, not both "
          "(a layout already names the dims N, C, H, W)", col=col_of(text, "[N, K]"))


def test_shape_with_only_nd_layout_is_accepted():
    text = decl((X_LINE, "  x: {dtypes: [float32], layouts: [ND], shape: [N, K]}"),
                ("  inplace: {y: x}", "  tile: 64"))
    spec = parse_spec(text, FILE)
    assert spec.inputs[0].shape == ("N", "K")


@pytest.mark.parametrize("shape, expected", [
    ("[]", "inputs.x.shape: give at least one dim name"),
    ("[N, N]", "inputs.x.shape: a dim name is repeated in ['N', 'N']"),
    ("[N, 3]", "inputs.x.shape: dim name 3 is not allowed; use letters, digits and underscores"),
    ("N", "inputs.x.shape: expected a list, got a string ('N')"),
])
def test_bad_shape(shape, expected):
    text = decl((X_LINE, f"  x: {{dtypes: [float32], shape: {shape}}}"))
    check(load_error(text), line_of(text, "shape:"), expected)


def test_differentiable_must_be_a_bool():
    text = decl((X_LINE, "  x: {dtypes: [float32], differentiable: 1}"))
    check(load_error(text), line_of(text, "differentiable"),
          "inputs.x.differentiable: expected true or false, got an integer (1)")


@pytest.mark.parametrize("domain, expected", [
    ("[0, inf]", "inputs.x.domain: expected finite bounds low < high, got [0.0, inf]"),
    ("[1, 1]", "inputs.x.domain: expected finite bounds low < high, got [1.0, 1.0]"),
    ("[2, 1]", "inputs.x.domain: expected low <= high, got [2.0, 1.0]"),
])
def test_bad_domain(domain, expected):
    text = decl((X_LINE, f"  x: {{dtypes: [float32], domain: {domain}}}"))
    check(load_error(text), line_of(text, "domain"), expected)


def test_domain_default_and_interval_notation():
    assert parse_spec(BASE, FILE).inputs[0].domain == (-3.0, 3.0)
    text = decl((X_LINE, '  x: {dtypes: [float32], domain: "(0, 5]"}'))
    assert parse_spec(text, FILE).inputs[0].domain == (0.0, 5.0)


def test_inputs_must_share_a_dtype():
    text = decl((X_LINE, X_LINE + "\n  w: {dtypes: [float16]}"))
    check(load_error(text), line_of(text, "inputs:"), "inputs: the inputs share no dtype, so no kernel can be compiled; "
          "give every input at least one common dtype")


def test_empty_sections():
    text = decl(("inputs:\n" + X_LINE, "inputs: {}"))
    check(load_error(text), line_of(text, "inputs: {}"), "inputs: declare at least one input")
    text = decl(("outputs:\n  y: {like: x}", "outputs: {}"))
    check(load_error(text), line_of(text, "outputs: {}"), "outputs: declare at least one output")
    text = decl(("forward:\n" + Y_FORWARD, "forward: {}"))
    check(load_error(text), line_of(text, "forward: {}"),
          "forward: give at least one `name: expression` line")


def test_output_like_must_name_an_input():
    text = decl(("  y: {like: x}", "  y: {like: z}"))
    check(load_error(text), line_of(text, "like: z"),
          "outputs.y.like: 'z' is not an input; expected one of: x", col=col_of(text, "z}"))


# ------------------------------------------------------------------------------------- attrs

def test_attr_type_must_be_float_int_bool_or_str():
    text = decl((ALPHA_LINE, "  alpha: {type: double, default: 0.5}"))
    check(load_error(text), line_of(text, "double"),
          "attrs.alpha.type: expected one of float, int, bool, str, got a string ('double')",
          col=col_of(text, "double"))


def test_attr_type_is_required():
    text = decl((ALPHA_LINE, "  alpha: {default: 0.5}"))
    check(load_error(text), line_of(text, "alpha:"), "attrs.alpha: missing required key 'type'")


def test_attr_default_outside_range():
    text = decl((ALPHA_LINE, "  alpha: {type: float, default: 1.5, range: [0.0, 1.0]}"))
    check(load_error(text), line_of(text, "alpha:"),
          "attrs.alpha.default: 1.5 is outside the range [0.0, 1.0]", col=col_of(text, "1.5"))


def test_int_attr_default_outside_range():
    text = decl((ALPHA_LINE, "  alpha: {type: int, default: 0, range: \"(0, 8]\"}"))
    check(load_error(text), line_of(text, "alpha:"),
          "attrs.alpha.default: 0 is outside the range (0, 8]")


def test_attr_default_on_an_open_end_is_outside():
    text = decl((ALPHA_LINE, "  alpha: {type: float, default: 0, range: \"(0, 1]\"}"))
    check(load_error(text), line_of(text, "alpha:"),
          "attrs.alpha.default: 0.0 is outside the range (0.0, 1.0]")


def test_range_low_above_high():
    text = decl((ALPHA_LINE, "  alpha: {type: float, default: 0.5, range: [1.0, 0.0]}"))
    check(load_error(text), line_of(text, "alpha:"),
          "attrs.alpha.range: expected low <= high, got [1.0, 0.0]", col=col_of(text, "[1.0, 0.0]"))


def test_interval_string_low_above_high():
    text = decl((ALPHA_LINE, '  alpha: {type: float, range: "(2, 1]"}'))
    check(load_error(text), line_of(text, "alpha:"),
          "attrs.alpha.range: expected low <= high, got (2.0, 1.0]")


def test_interval_string_with_unreadable_bounds():
    text = decl((ALPHA_LINE, '  alpha: {type: float, range: "(a, 1]"}'))
    check(load_error(text), line_of(text, "alpha:"),
          "attrs.alpha.range: cannot read the bounds of '(a, 1]'")


def _range(notation: str) -> Interval:
    text = decl((ALPHA_LINE, f"  alpha: {{type: float, range: {notation}}}"))
    return parse_spec(text, FILE).attrs[0].range


def test_interval_notation_open_and_closed_ends():
    iv = _range('"(0, inf]"')
    assert iv == Interval(0.0, math.inf, low_open=True, high_open=False)
    assert 0.0 not in iv and 1e-300 in iv and 5.0 in iv and math.inf in iv
    assert math.nan not in iv and -1.0 not in iv
    assert str(iv) == "(0.0, inf]"

    iv = _range('"[0, 1)"')
    assert (iv.low_open, iv.high_open) == (False, True)
    assert 0.0 in iv and 0.999 in iv and 1.0 not in iv

    iv = _range('"(-inf, 0)"')
    assert -math.inf not in iv and -1e9 in iv and 0.0 not in iv

    iv = _range('"[ -1 , 1e3 ]"')
    assert iv == Interval(-1.0, 1000.0) and -1.0 in iv and 1000.0 in iv


def test_list_range_is_closed():
    iv = _range("[0, 1]")
    assert iv == Interval(0.0, 1.0, False, False)
    assert 0.0 in iv and 1.0 in iv and 1.0000001 not in iv
    assert _range("[-.inf, .inf]") == Interval(-math.inf, math.inf)


def test_null_default_needs_null_means():
    text = decl((ALPHA_LINE, "  alpha: {type: float, default: null}"))
    check(load_error(text), line_of(text, "alpha:"),
          "attrs.alpha.default: null is only allowed with null_means (the value the attr takes in "
          "expressions when it is null)", col=col_of(text, "null"))


def test_null_default_with_null_means_is_accepted():
    text = decl((ALPHA_LINE, "  alpha: {type: float, default: null, null_means: 0.25}"))
    spec = parse_spec(text, FILE)
    a = spec.attrs[0]
    assert (a.default, a.required, a.null_means, a.nullable) == (None, False, 0.25, True)


def test_null_means_on_a_non_float_attr():
    text = decl((ALPHA_LINE, "  alpha: {type: int, default: 1, null_means: 0}"))
    check(load_error(text), line_of(text, "alpha:"),
          "attrs.alpha.null_means: only float attrs can be null",
          col=col_of(text, "0}"))


def test_null_means_must_be_a_number():
    text = decl((ALPHA_LINE, "  alpha: {type: float, null_means: none}"))
    check(load_error(text), line_of(text, "alpha:"),
          "attrs.alpha.null_means: expected a number, got a string ('none')")


def test_range_on_a_bool_attr():
    text = decl((ALPHA_LINE, "  alpha: {type: bool, default: false, range: [0, 1]}"))
    check(load_error(text), line_of(text, "alpha:"), "attrs.alpha.range: a bool attr takes no range",
          col=col_of(text, "[0, 1]"))


def test_attr_without_default_is_required():
    spec = parse_spec(decl((ALPHA_LINE, "  alpha: {type: float}")), FILE)
    assert spec.attrs[0].required and spec.attrs[0].default is None


# ----------------------------------------------------------------------------- required keys

@pytest.mark.parametrize("key, section", [
    ("name", "name: demo\n"),
    ("inputs", "inputs:\n" + X_LINE + "\n"),
    ("outputs", "outputs:\n  y: {like: x}\n"),
    ("forward", "forward:\n" + Y_FORWARD + "\n"),
], ids=["name", "inputs", "outputs", "forward"])
def test_missing_required_key(key, section):
    text = decl((section, ""))
    check(load_error(text), 1, f"the declaration: missing required key {key!r}", col=1)


def test_missing_key_is_reported_at_the_first_key_after_comments():
    text = "# a comment\n\n" + decl(("name: demo\n", ""))
    check(load_error(text), line_of(text, "summary:"), "missing required key 'name'")


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n"])
def test_empty_file(text):
    check(load_error(text), 1, "the file is empty; an operator declaration is a YAML mapping")


# ------------------------------------------------------------------------------ YAML itself

def test_invalid_yaml_mapping_value():
    text = decl(("summary: A small", "summary: ratio: A small"))
    check(load_error(text), line_of(text, "summary:"),
          "invalid YAML: mapping values are not allowed here",
          col=col_of(text, ": A small"))


def test_invalid_yaml_tab_indentation():
    text = decl(("  y: {like: x}", "\ty: {like: x}"))
    check(load_error(text), line_of(text, "\ty:"),
          "invalid YAML: while scanning for the next token: found character '\\t' that cannot "
          "start any token")


def test_invalid_yaml_unbalanced_bracket():
    text = decl((X_LINE, "  x: {dtypes: [float32]]}"))
    check(load_error(text), line_of(text, "]]"), "invalid YAML: while parsing a flow mapping (line 4): expected ',' or '}', but got ']'",
          col=col_of(text, "]}"))


@pytest.mark.parametrize("tagged", [
    "!!python/object:os.system demo",
    "!!python/name:os.system",
    "!custom demo",
    "!!binary ZGVtbw==",
])
def test_yaml_tags_are_rejected(tagged):
    text = decl(("name: demo", f"name: {tagged}"))
    check(load_error(text), 1, "YAML tags (!...) are not supported; declarations use plain maps, lists, strings and numbers",
          col=len("name: ") + 1)


def test_python_tags_are_never_constructed(tmp_path):
    marker = tmp_path / "ran"
    text = decl(("name: demo", f'name: !!python/object/apply:os.system ["touch {marker}"]'))
    check(load_error(text), 1,
          "YAML tags (!...) are not supported")
    assert not marker.exists()


def test_merge_keys_are_rejected():
    text = decl((X_LINE, "  x: {dtypes: [float32]}\n  w: {<<: {dtypes: [float32]}}"))
    check(load_error(text), line_of(text, "<<"),
          "YAML merge keys (<<) are not supported; write the keys out", col=col_of(text, "<<"))


def test_anchors_and_aliases_are_rejected():
    # aliases can expand a short file exponentially; declarations write values out instead
    text = decl((X_LINE, "  x: &common {dtypes: [float32]}\n  w: *common"),
                (Y_FORWARD, "  y: w * where(x > 0, x, alpha * x)"))
    check(load_error(text), line_of(text, "&common"), "YAML anchors (&name) are not supported",
          col=col_of(text, "&common"))
    text = decl(append="extra: *nothing\n")
    assert "alias" in str(load_error(text)) or "found undefined alias" in str(load_error(text))


def test_deep_nesting_is_rejected():
    text = decl(append="extra: " + "[" * 60 + "]" * 60 + "\n")
    check(load_error(text), line_of(text, "extra"), "the document nests deeper than 50 levels")


# --------------------------------------------------------------------------- YAML 1.1 quirks

@pytest.mark.parametrize("word", ["on", "yes", "off", "no", "y", "n"])
def test_yaml11_booleans_stay_strings(word):
    text = decl((X_LINE, f"  x: {{dtypes: [float32], differentiable: {word}}}"))
    check(load_error(text), line_of(text, "differentiable"),
          f"inputs.x.differentiable: expected true or false, got a string ({word!r})",
          col=col_of(text, f"{word}}}"))


def test_yaml11_boolean_default_for_a_bool_attr_is_rejected():
    text = decl((ALPHA_LINE, "  alpha: {type: bool, default: on}"))
    check(load_error(text), line_of(text, "alpha:"),
          "attrs.alpha.default: expected true or false, got a string ('on')")


@pytest.mark.parametrize("word, value", [
    ("true", True), ("True", True), ("false", False), ("FALSE", False),
])
def test_true_and_false_are_booleans(word, value):
    text = decl((ALPHA_LINE, f"  alpha: {{type: bool, default: {word}}}"),
                (Y_FORWARD, "  y: where(alpha, x, -x)"))
    assert parse_spec(text, FILE).attrs[0].default is value


def test_yaml11_word_is_a_plain_name():
    assert parse_spec(decl(("name: demo", "name: on")), FILE).name == "on"


@pytest.mark.parametrize("literal, value", [
    ("1e-3", 1e-3), ("1E3", 1000.0), ("1.5e+2", 150.0), (".5", 0.5), ("1.", 1.0), ("+1", 1.0),
    ("-0.25", -0.25), ("7", 7.0),
])
def test_numbers_in_exponent_form_are_floats(literal, value):
    text = decl((ALPHA_LINE, f"  alpha: {{type: float, default: {literal}}}"))
    default = parse_spec(text, FILE).attrs[0].default
    assert type(default) is float and default == value


@pytest.mark.parametrize("literal", ["0x10", "1_000", "0o17", "1:30"])
def test_other_number_spellings_stay_strings(literal):
    text = decl((ALPHA_LINE, f"  alpha: {{type: float, default: {literal}}}"))
    check(load_error(text), line_of(text, "alpha:"), f"expected a number, got a string ({literal!r})")


def test_int_attr_keeps_integers():
    text = decl((ALPHA_LINE, "  alpha: {type: int, default: 3, range: [0, 8]}"))
    a = parse_spec(text, FILE).attrs[0]
    assert type(a.default) is int and a.default == 3


# ---------------------------------------------------------------------------------- schedule

def test_inplace_names_an_unknown_output():
    text = decl(("  inplace: {y: x}", "  inplace: {z: x}"))
    check(load_error(text), line_of(text, "inplace"), "schedule.inplace: 'z' is not an output")


def test_inplace_names_an_unknown_input():
    text = decl(("  inplace: {y: x}", "  inplace: {y: w}"))
    check(load_error(text), line_of(text, "inplace"), "schedule.inplace.y: 'w' is not an input",
          col=col_of(text, "w}"))


def test_tile_must_be_a_multiple_of_16():
    text = decl(("  inplace: {y: x}", "  tile: 100"))
    check(load_error(text), line_of(text, "tile"),
          "schedule.tile: expected a multiple of 16 (a full vector), got 100", col=col_of(text, "100"))


@pytest.mark.parametrize("key, value, expected", [
    ("tile", "8", "schedule.tile: expected an integer in 16..65536, got 8"),
    ("tile", "131072", "schedule.tile: expected an integer in 16..65536, got 131072"),
    ("threads", "0", "schedule.threads: expected an integer in 1..1024, got 0"),
    ("parallel_threshold", "-1",
     "schedule.parallel_threshold: expected an integer in 0..1099511627776, got -1"),
])
def test_schedule_numbers_out_of_range(key, value, expected):
    text = decl(("  inplace: {y: x}", f"  {key}: {value}"))
    check(load_error(text), line_of(text, key), expected)


def test_schedule_values_are_read():
    text = decl(("  inplace: {y: x}",
                 "  inplace: {y: x}\n  tile: 256\n  parallel_threshold: 0\n  threads: 2"))
    s = parse_spec(text, FILE).schedule
    assert (s.inplace, s.tile, s.parallel_threshold, s.threads) == ((("y", "x"),), 256, 0, 2)
    assert s.loc.line == line_of(text, "inplace")


def test_load_spec_rejects_non_utf8(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(BASE.replace("A small", "A sm\xe4ll").encode("latin-1"))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    check(info.value, 1, "the file is not UTF-8 text", file=str(path))


def test_load_spec_names_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(decl(("name: demo", "name: Bad")), encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    check(info.value, 1, "name: 'Bad' is not allowed; use lower-case letters, digits and "
          "underscores, starting with a letter", file=str(path))


# ------------------------------------------------------------------------- expression errors

def forward_text(expr: str, quoted: bool = False) -> str:
    value = f'"{expr}"' if quoted else expr
    return decl((Y_FORWARD, f"  y: {value}"))


def test_undefined_name_with_suggestion():
    text = forward_text("where(x > 0, x, alpa * x)")
    err = dsl_error(text)
    check(err, line_of(text, "alpa"), "forward.y: undefined name 'alpa'; did you mean 'alpha'?",
          col=col_of(text, "alpa"))
    expr, at = caret(err)
    assert expr == "where(x > 0, x, alpa * x)" and expr[at:].startswith("alpa")


def test_undefined_name_without_suggestion_lists_known_names():
    text = forward_text("x * gain")
    err = dsl_error(text)
    check(err, line_of(text, "gain"), "forward.y: undefined name 'gain'; known names: alpha, x",
          col=col_of(text, "gain"))
    expr, at = caret(err)
    assert expr[at:] == "gain"


def test_undefined_name_suggests_a_function():
    text = forward_text("x * sigmoidd")
    err = dsl_error(text)
    check(err, line_of(text, "sigmoidd"), "undefined name 'sigmoidd'; did you mean 'sigmoid'?")
    assert caret(err) == ("x * sigmoidd", 4)


def test_unknown_function():
    text = forward_text("gelu(x)")
    err = dsl_error(text)
    check(err, line_of(text, "gelu"), "forward.y: unknown function 'gelu'; the functions are: "
          "abs, amax, amin, ceil, clamp, conv2d, conv_transpose2d, cos, erf, erfc, exp, expm1, fft_down, fft_up, "
          "floor, isinf, isnan, log, log1p, logsumexp, matmul, max, maximum, mean, min, minimum, "
          "pow, round, sigmoid, sign, sin, softplus, sqrt, sum, tanh, where", col=col_of(text, "gelu"))
    assert caret(err) == ("gelu(x)", 0)


def test_unknown_function_with_suggestion():
    text = forward_text("x * sigmod(x)")
    err = dsl_error(text)
    check(err, line_of(text, "sigmod"), "unknown function 'sigmod'; did you mean 'sigmoid'?; "
          "the functions are: abs, amax, amin, ceil, clamp", col=col_of(text, "sigmod"))
    assert caret(err) == ("x * sigmod(x)", 4)


@pytest.mark.parametrize("expr, token, what", [
    ("x.real", "x.real", "attribute access (a.b)"),
    ("x[0]", "x[0]", "indexing ([...])"),
    ("alpha * x[0]", "x[0]", "indexing ([...])"),
    ("lambda: x", "lambda", "lambda"),
    ("[x]", "[x]", "a list"),
    ("(x, x)", "(x, x)", "a tuple"),
    ("{x: 1}", "{x: 1}", "a dict"),
    ("x if (t := x) else x", "t := x", "the := operator"),
    ("f'{x}'", "f'", "an f-string"),
])
def test_constructs_outside_the_language(expr, token, what):
    text = forward_text(expr, quoted=True)
    err = dsl_error(text)
    check(err, line_of(text, expr), f"forward.y: {what} is not part of the expression language; "
          "use numbers, names, + - * / **, comparisons, & | ~, and the functions abs, amax, amin, ceil")
    shown, at = caret(err)
    assert shown == expr and shown[at:].startswith(token)


@pytest.mark.parametrize("expr", ["np.exp(x)", "(lambda q: q)(x)", "x.clip(0, 1)"])
def test_only_plain_function_names_can_be_called(expr):
    text = forward_text(expr, quoted=True)
    err = dsl_error(text)
    check(err, line_of(text, expr),
          "forward.y: only the language's functions can be called, by plain name")
    shown, at = caret(err)
    assert shown == expr and at == (1 if expr.startswith("(") else 0)


def test_keyword_arguments():
    text = forward_text("clamp(x, lo=0, hi=1)", quoted=True)
    err = dsl_error(text)
    check(err, line_of(text, "clamp"), "forward.y: clamp() takes positional arguments only")
    shown, at = caret(err)
    assert shown == "clamp(x, lo=0, hi=1)" and at > shown.index("lo")


@pytest.mark.parametrize("expr, expected", [
    ("max(x)", "max() takes 2 arguments, got 1"),
    ("exp(x, 2)", "exp() takes 1 argument, got 2"),
    ("clamp(x, 0)", "clamp() takes 3 arguments, got 2"),
    ("where(x > 0, x)", "where() takes 3 arguments, got 2"),
    ("tanh()", "tanh() takes 1 argument, got 0"),
])
def test_wrong_number_of_arguments(expr, expected):
    text = forward_text(expr)
    err = dsl_error(text)
    check(err, line_of(text, expr), f"forward.y: {expected}", col=col_of(text, expr))
    assert caret(err) == (expr, 0)


def test_power_with_a_condition_as_exponent():
    text = forward_text("x ** (x > 0)")
    err = dsl_error(text)
    check(err, line_of(text, "**"), "forward.y: the exponent of ** must be a number",
          col=col_in(text, "x ** (x > 0)", "x > 0"))
    expr, at = caret(err)
    assert expr[at:] == "x > 0)"


@pytest.mark.parametrize("expr, op", [("e^x", "^"), ("x ** 2 ^ 3", "^"), ("x % 2", "%")])
def test_the_caret_points_at_an_unsupported_operator(expr, op):
    text = forward_text(expr, quoted=True)
    err = dsl_error(text)
    text_at, at = caret(err)
    assert text_at[at] == op, (text_at, at)
    if op == "^":  # a power written as in a paper
        assert "write a ** b (or exp(x) for e ** x)" in str(err)


@pytest.mark.parametrize("expr", ["x ** 2", "x ** 0.5", "x ** -1", "x ** (1 / 3)", "x ** pi"])
def test_power_with_a_constant_exponent_is_accepted(expr):
    build_graphs(parse_spec(forward_text(expr, quoted=True), FILE))


def test_power_base_must_be_a_number():
    text = forward_text("(x > 0) ** 2")
    err = dsl_error(text)
    check(err, line_of(text, "**"),
          "the base of ** must be a number, but this is a true/false condition")
    assert caret(err) == ("(x > 0) ** 2", 1)


def test_comparison_used_as_a_number():
    text = forward_text("(x > 0) * alpha")
    err = dsl_error(text)
    check(err, line_of(text, "(x > 0) * alpha"),
          "forward.y: each side of * must be a number, but this is a "
          "true/false condition; turn a condition into a number with where(cond, a, b)",
          col=col_in(text, "(x > 0) * alpha", "x > 0"))
    expr, at = caret(err)
    assert expr[at:].startswith("x > 0")


def test_comparison_used_as_a_function_argument():
    text = forward_text("exp(x > 0)")
    err = dsl_error(text)
    check(err, line_of(text, "exp"),
          "argument 1 of exp() must be a number, but this is a true/false condition",
          col=col_of(text, "x > 0"))
    assert caret(err) == ("exp(x > 0)", 4)


def test_number_used_as_a_where_condition():
    text = forward_text("where(alpha * x, x, 0)")
    err = dsl_error(text)
    check(err, line_of(text, "where"),
          "forward.y: argument 1 of where() must be a true/false condition "
          "(a comparison such as x > 0), but this is a number", col=col_of(text, "alpha * x"))
    assert caret(err) == ("where(alpha * x, x, 0)", 6)


def test_number_used_as_a_conditional_expression_test():
    text = forward_text("x if alpha else 0")
    err = dsl_error(text)
    check(err, line_of(text, "x if alpha"),
          "the condition of `a if c else b` must be a true/false condition",
          col=col_in(text, "x if alpha", "alpha"))
    assert caret(err) == ("x if alpha else 0", 5)


@pytest.mark.parametrize("expr, expected", [
    ("~x", "the operand of ~ / not must be a true/false condition"),
    ("where(not alpha, x, 0)", "the operand of ~ / not must be a true/false condition"),
    ("where((x > 0) & alpha, x, 0)", "each side of & and | must be a true/false condition"),
    ("where(x > 0 or alpha, x, 0)", "each operand of or must be a true/false condition"),
    ("-(x > 0)", "the operand of - must be a number, but this is a true/false condition"),
    ("(x > 0) == (x < 1)",
     "each side of a comparison must be a number, but this is a true/false condition"),
])
def test_true_false_and_numbers_do_not_mix(expr, expected):
    text = forward_text(expr, quoted=True)
    err = dsl_error(text)
    check(err, line_of(text, expr), expected)
    assert caret(err)[0] == expr


def test_bitwise_and_binds_tighter_than_comparison():
    # `x > 0 & x < 1` is `x > (0 & x) < 1` in Python's grammar; the language keeps that grammar
    text = forward_text("where(x > 0 & x < 1, x, 0)", quoted=True)
    err = dsl_error(text)
    check(err, line_of(text, "x > 0 & x < 1"), "each side of & and | must be a true/false condition")
    expr, at = caret(err)
    assert expr[at:].startswith("0 & x")


@pytest.mark.parametrize("expr, expected", [
    ("x % 2", "the operator % is not supported"),
    ("x // 2", "the operator // is not supported"),
    ("x @ x", "the operator @ is not supported"),
    ("x ^ x", "^ is not a power here: write a ** b"),
    ("where(x in x, x, 0)", "the comparison in is not supported"),
    ("x * 'a'", "a string such as 'a' can only be compared with a str attr"),
    ("x * 1j", "the constant 1j is not a number"),
])
def test_unsupported_operators_and_constants(expr, expected):
    text = forward_text(expr, quoted=True)
    err = dsl_error(text)
    check(err, line_of(text, expr), f"forward.y: {expected}")
    assert caret(err)[0] == expr


def test_syntax_error():
    text = forward_text("x + * 2")
    err = dsl_error(text)
    check(err, line_of(text, "x + * 2"),
          "forward.y: syntax error: invalid syntax", col=col_of(text, "* 2"))
    expr, at = caret(err)
    assert expr == "x + * 2" and expr[at] == "*"


def test_unbalanced_parenthesis():
    text = forward_text("where(x > 0, x, alpha * x")
    err = dsl_error(text)
    check(err, line_of(text, "where(x > 0, x, alpha * x"), "forward.y: syntax error")
    assert caret(err)[0] == "where(x > 0, x, alpha * x"


def test_empty_expression():
    text = forward_text("   ", quoted=True)
    err = dsl_error(text)
    check(err, line_of(text, '  y: "'), "forward.y: the expression is empty")
    assert str(err).splitlines()[-1].strip() == "^"


def test_statements_are_syntax_errors():
    text = forward_text("x; y", quoted=True)
    err = dsl_error(text)
    check(err, line_of(text, "x; y"), "forward.y: syntax error")
    assert caret(err) == ("x; y", 1)


def test_named_dims_do_not_mix_with_any_rank():
    text = decl((X_LINE, "  x: {dtypes: [float32], shape: [N, K]}\n  b: {dtypes: [float32]}"),
                (Y_FORWARD, "  y: x + b"))
    err = dsl_error(text)
    check(err, line_of(text, "  y: x + b"), "forward.y: combines a value with dims ['N', 'K'] and a "
          "value of any rank; give the inputs shapes (shape: [...]) or a 4-d layout so their axes "
          "can be matched")


def test_named_dims_meet_a_4d_layout():
    text = decl((X_LINE, "  x: {dtypes: [float32], layouts: [NCHW, NHWC]}\n"
                         "  b: {dtypes: [float32], shape: [C]}"),
                (Y_FORWARD, "  y: x + b"))
    graphs = build_graphs(parse_spec(text, FILE))
    assert graphs.differentiable == ("x", "b")


def test_error_column_counts_from_the_expression_start():
    text = forward_text("where(x > 0, x, alpha * x) + foo")
    err = dsl_error(text)
    check(err, line_of(text, "foo"), "forward.y: undefined name 'foo'", col=col_of(text, "foo"))
    expr, at = caret(err)
    assert expr[at:] == "foo" and at == len("where(x > 0, x, alpha * x) + ")


def test_expression_on_the_line_below_its_name():
    text = decl((Y_FORWARD, "  y:\n    x * 2 + foo"))
    err = dsl_error(text)
    check(err, line_of(text, "foo"), "undefined name 'foo'", col=col_of(text, "foo"))
    assert caret(err) == ("x * 2 + foo", 8)


# -------------------------------------------------------------------------- forward bindings

def test_output_not_computed_by_forward():
    text = decl(("  y: {like: x}", "  y: {like: x}\n  z: {like: x}"))
    check(dsl_error(text), line_of(text, "z: {like"),
          "outputs.z: forward does not compute 'z'; add a line `z: <expression>` under forward")


def test_output_that_is_a_condition():
    text = forward_text("x > 0")
    check(dsl_error(text), line_of(text, "  y: x > 0"),
          "forward.y: an output must be a number, but this is a true/false condition; use "
          "where(cond, a, b)")


@pytest.mark.parametrize("name, what", [("x", "an input"), ("alpha", "an attr")])
def test_forward_binding_reuses_an_input_or_attr(name, what):
    text = decl((Y_FORWARD, f"  {name}: x * 2\n" + Y_FORWARD))
    check(dsl_error(text), line_of(text, f"  {name}: x * 2"),
          f"forward.{name}: {name!r} is already {what}")


@pytest.mark.parametrize("name", ["exp", "where", "clamp"])
def test_forward_binding_uses_a_function_name(name):
    text = decl((Y_FORWARD, f"  {name}: x * 2\n" + Y_FORWARD))
    check(dsl_error(text), line_of(text, f"  {name}: x * 2"),
          f"forward.{name}: {name!r} is the name of a function of the expression language; "
          "pick another name")


@pytest.mark.parametrize("name, value", [("e", "2.718281828459045"), ("pi", "3.14159"), ("inf", "inf")])
def test_forward_binding_uses_a_constant_name(name, value):
    text = decl((Y_FORWARD, f"  {name}: x * 2\n" + Y_FORWARD))
    message = check(dsl_error(text), line_of(text, f"  {name}: x * 2"),
                    f"forward.{name}: {name!r} is a constant of the expression language ({name} = ",
                    "pick another name")
    assert value in message and "function" not in message


def test_forward_lines_see_only_earlier_lines():
    text = decl((Y_FORWARD, "  y: t * 2\n  t: x + 1"))
    check(dsl_error(text), line_of(text, "  y: t * 2"), "forward.y: undefined name 't'")
    ok = decl((Y_FORWARD, "  t: x + 1\n  y: t * 2"))
    assert build_graphs(parse_spec(ok, FILE)).forward.outputs[0][0] == "y"


def test_gradient_names_are_not_in_forward_scope():
    text = forward_text("x * dy")
    err = dsl_error(text)
    check(err, line_of(text, "x * dy"), "forward.y: undefined name 'dy'", col=col_of(text, "dy"))
    assert caret(err) == ("x * dy", 4)


def test_language_features_are_accepted():
    exprs = [
        "x if x > 0 and not x > 5 or x < -1 else -x",
        "where((x > 0) & ~(x > 5) | (x < -1), x, -x)",
        "where(0 < x <= 1, x, 0)",
        "where(True, x, 0) * pi + e - inf * 0 + 1e-3",
        "min(x, alpha) + max(x, 0) + clamp(x, -1, 1)",
        "exp(x) + expm1(x) + log(abs(x) + 1) + log1p(abs(x)) + sqrt(abs(x)) + sigmoid(x) + tanh(x)",
        "where(x != x, 0, x) / 2 - -x",
    ]
    for expr in exprs:
        build_graphs(parse_spec(forward_text(expr, quoted=True), FILE))


def test_inputs_shadow_constants():
    text = decl(("inputs:\n", "inputs:\n  e: {dtypes: [float32, float64]}\n"),
                (Y_FORWARD, "  y: e * x"))
    graphs = build_graphs(parse_spec(text, FILE))
    assert graphs.forward.format() == "y = e * x"


# ---------------------------------------------------------------------------------- backward

TWO_INPUTS = (X_LINE, X_LINE + "\n  w: {dtypes: [float32, float64]}")
W_FORWARD = (Y_FORWARD, "  y: w * x")


def test_backward_for_a_non_differentiable_input():
    text = decl((X_LINE, "  x: {dtypes: [float32], differentiable: false}"),
                append="backward:\n  x: dy * 2\n")
    check(dsl_error(text), line_of(text, "  x: dy * 2"),
          "backward.x: input 'x' is declared differentiable: false, so it takes no gradient")


def test_backward_missing_a_gradient():
    text = decl(TWO_INPUTS, W_FORWARD, append="backward:\n  x: dy * w\n")
    check(dsl_error(text), line_of(text, "  x: dy * w"),
          "backward: no gradient given for input 'w'; write a line `w: <expression>` or mark the "
          "input differentiable: false")


def test_backward_need_not_cover_non_differentiable_inputs():
    text = decl(TWO_INPUTS, W_FORWARD,
                ("  w: {dtypes: [float32, float64]}",
                 "  w: {dtypes: [float32, float64], differentiable: false}"),
                append="backward:\n  x: dy * w\n")
    graphs = build_graphs(parse_spec(text, FILE))
    assert graphs.declared and graphs.differentiable == ("x",)


def test_backward_gradient_that_is_a_condition():
    text = decl(append="backward:\n  x: dy > 0\n")
    err = dsl_error(text)
    check(err, line_of(text, "  x: dy > 0"),
          "backward.x: a gradient must be a number, not a true/false condition",
          col=col_of(text, "dy > 0"))
    assert caret(err) == ("dy > 0", 0)


@pytest.mark.parametrize("line, expected", [
    ("  dy: x", "backward.dy: 'dy' is already the gradient of an output"),
    ("  y: x", "backward.y: 'y' is already defined in forward"),
    ("  alpha: x", "backward.alpha: 'alpha' is already an attr"),
    ("  exp: x", "backward.exp: 'exp' is the name of a function of the expression language"),
])
def test_backward_temporary_name_clashes(line, expected):
    text = decl(append=f"backward:\n{line}\n  x: where(x > 0, dy, alpha * dy)\n")
    check(dsl_error(text), line_of(text, line), expected)


def test_backward_undefined_name():
    text = decl(append="backward:\n  x: where(x > 0, dy, alpha * dz)\n")
    err = dsl_error(text)
    check(err, line_of(text, "dz"), "backward.x: undefined name 'dz'; known names: alpha, dy, x, y",
          col=col_of(text, "dz"))
    expr, at = caret(err)
    assert expr[at:] == "dz)"


def test_backward_temporaries_are_allowed():
    text = decl(append="backward:\n  g: alpha * dy\n  x: where(x > 0, dy, g)\n")
    graphs = build_graphs(parse_spec(text, FILE))
    assert graphs.declared
    assert [name for name, _ in graphs.backward.outputs] == ["x"]


def test_backward_sees_forward_results():
    text = decl((Y_FORWARD, "  act: where(x > 0, x, alpha * x)\n  y: act"),
                append="backward:\n  x: where(act > 0, dy, alpha * dy)\n")
    assert build_graphs(parse_spec(text, FILE)).declared


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "leaky.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_hand_written_backward_that_disagrees(tmp_path):
    text = decl(append="backward:\n  x: where(x > 0, dy, dy)\n")
    build_graphs(parse_spec(text, FILE))  # well formed: only the comparison finds the mistake
    path = _write(tmp_path, text)
    with pytest.raises(SpecError) as info:
        make_op(path)
    message = check(info.value, line_of(text, "  x: where(x > 0, dy, dy)"),
                    "backward.x: the hand-written gradient disagrees with the one derived from forward",
                    "the derived gradient is", file=str(path))
    assert "alpha" in message.split("the derived gradient is", 1)[1]


def test_hand_written_backward_that_agrees(tmp_path):
    text = decl(append="backward:\n  x: where(x > 0, dy, alpha * dy)\n")
    op = make_op(_write(tmp_path, text))
    assert op.name == "demo" and op.graphs.declared
    assert op.spec.backward[0].expr == "where(x > 0, dy, alpha * dy)"


def test_hand_written_backward_of_a_broadcast_input_is_reduced(tmp_path):
    text = decl(TWO_INPUTS, (X_LINE, "  x: {dtypes: [float32, float64]}"), W_FORWARD,
                append="backward:\n  x: dy * w\n  w: dy * x\n")
    op = make_op(_write(tmp_path, text))
    assert [n for n, _ in op.graphs.backward.outputs] == ["x", "w"]
    assert all(node.op == "sum_to" for _, node in op.graphs.backward.outputs)


def test_bundled_example_with_hand_written_backward_loads():
    op = make_op(EXAMPLES / "scaled_leaky_relu.yaml")
    assert op.graphs.declared and op.graphs.differentiable == ("x", "gain")


# ------------------------------------------------------------------------------ valid inputs

def test_bundled_leaky_relu_declaration():
    path = operators_dir() / "leaky_relu.yaml"
    text = path.read_text(encoding="utf-8")
    spec = load_spec(path)
    assert spec.name == "leaky_relu" and spec.summary.startswith("LeakyReLU")
    (x,) = spec.inputs
    assert x.name == "x" and x.dtypes == ("float16", "float32", "float64", "int8", "int16", "int32")
    assert x.layouts == ("ND", "NCHW", "NHWC") and x.layouts_declared
    assert x.shape is None and x.differentiable and x.domain == (-3.0, 3.0)
    assert x.loc.line == line_of(text, "  x: {dtypes")
    (alpha,) = spec.attrs
    assert (alpha.name, alpha.type, alpha.default, alpha.required) == ("alpha", "float", 0.2, False)
    assert alpha.range == Interval(0.0, 1.0) and not alpha.range.low_open and not alpha.range.high_open
    assert alpha.null_means is None and alpha.quantize == 7 and spec.precision_reduce
    assert [(o.name, o.like) for o in spec.outputs] == [("y", "x")]
    assert [(b.name, b.expr) for b in spec.forward] == [("y", "where(x > 0, x, alpha * x)")]
    assert spec.backward is None
    assert spec.schedule.inplace == (("y", "x"),)
    assert spec.schedule.tile is None and spec.schedule.threads is None
    assert spec.dtypes == ("float16", "float32", "float64", "int8", "int16", "int32")
    assert spec.float_dtypes == ("float16", "float32", "float64") and spec.layouts == ("ND", "NCHW", "NHWC")
    graphs = build_graphs(spec)
    assert not graphs.declared and graphs.differentiable == ("x",)


def test_bundled_examples_parse():
    for path in sorted(EXAMPLES.glob("*.yaml")):
        spec = load_spec(path)
        build_graphs(spec)
    cap = load_spec(EXAMPLES / "clipped_elu.yaml").attr("cap")
    assert cap.range == Interval(0.0, math.inf, low_open=True) and cap.default == 6.0


REFORMATTED = """\
# The same operator written differently: block style, comments, spacing.
name:   demo
summary: A small valid operator; every test changes one thing in it.

inputs:
  x:
    dtypes: [ float32,float64 ]     # two dtypes
    layouts:
      - ND
      - NCHW
      - NHWC
attrs:
  alpha:
    type: float
    default: 5e-1
    range: [0, 1]
outputs:
  y:
    like: x
forward:
  y:   where(x>0, x, alpha*x)   # the formula, spaced differently
schedule:
  inplace:
    y: x
"""


def test_canonical_ignores_comments_and_layout_of_the_text():
    a, b = parse_spec(BASE, FILE), parse_spec(REFORMATTED, "other/place.yaml")
    assert a.canonical() == b.canonical()
    assert a != b  # the locations differ


def test_canonical_changes_with_an_expression():
    a = parse_spec(BASE, FILE)
    b = parse_spec(decl((Y_FORWARD, "  y: where(x > 0, x, alpha * x * 2)")), FILE)
    assert a.canonical() != b.canonical()
    assert a.canonical()["forward"] != b.canonical()["forward"]


@pytest.mark.parametrize("a, b", [("(x + alpha) * 2", "x + alpha * 2"), ("x - (alpha - 1)", "x - alpha - 1"),
                                  ("where(x > 0, x, 1)", "where(x > 0, 1, x)"), ("x + 1", "x + 1.5"),
                                  ("x + alpha", "x + alpha_")])
def test_canonical_tells_apart_what_the_parentheses_and_names_say(a, b):
    def form(text):
        return parse_spec(decl((Y_FORWARD, f"  y: {text}")), FILE).canonical()["forward"]
    assert form(a) != form(b)
    assert form(a) == form(f"({a.replace(' ', '')})")  # spacing and redundant parentheses: the same


@pytest.mark.parametrize("edit", [
    (ALPHA_LINE, "  alpha: {type: float, default: 0.25, range: [0.0, 1.0]}"),
    (ALPHA_LINE, "  alpha: {type: float, default: 0.5, range: \"(0, 1]\"}"),
    (X_LINE, "  x: {dtypes: [float32], layouts: [ND, NCHW, NHWC]}"),
    ("  inplace: {y: x}", "  tile: 64"),
], ids=["default", "range", "dtypes", "schedule"])
def test_canonical_changes_with_a_field(edit):
    assert parse_spec(BASE, FILE).canonical() != parse_spec(decl(edit), FILE).canonical()


def test_spec_is_frozen():
    spec = parse_spec(BASE, FILE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "other"
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.inputs[0].dtypes = ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.schedule.tile = 32


# ------------------------------------------------------------------------------------ safety

def test_expressions_are_never_executed(tmp_path):
    marker = tmp_path / "ran"
    payload = f"__import__('os').system('touch {marker}')"
    text = forward_text(payload, quoted=True)
    err = dsl_error(text)
    check(err, line_of(text, "__import__"),
          "forward.y: only the language's functions can be called, by plain name")
    assert not marker.exists()


def test_printed_graphs_use_only_parsed_values():
    text = forward_text("where(x>0,x,alpha*x)   # spacing differs", quoted=False)
    printed = build_graphs(parse_spec(text, FILE)).forward.format()
    assert printed == "y = where(x > 0, x, alpha * x)"
    ast.parse(printed.split(" = ", 1)[1], mode="eval")


@pytest.mark.parametrize("expr", [
    "where((x > 0) | (x < -1), x, 0)",
    "where(~(x > 0) & (x < 1), -x, x ** 3)",
    "where((x > 0) & (alpha > 0.5) | (x < -1), (x - 1) / (alpha + 1), -(x * alpha))",
])
def test_printed_expressions_parse_back(expr):
    text = forward_text(expr, quoted=True)
    graphs = build_graphs(parse_spec(text, FILE))
    printed = graphs.forward.format().split(" = ", 1)[1]
    again = build_graphs(parse_spec(forward_text(printed, quoted=True), FILE))
    assert again.forward.digest == graphs.forward.digest


# ----------------------------------------------------------------- locations and value checks

@pytest.mark.parametrize("old, new, needle", [
    ("  inplace: {y: x}", "  inplce:\n    y: x", "inplce"),
    (X_LINE, '  "a b":\n    dtypes: [float32]', '"a b"'),
], ids=["unknown-key", "bad-name"])
def test_block_mapping_errors_point_at_the_key(old, new, needle):
    text = decl((old, new))
    check(load_error(text), line_of(text, needle))


def test_quoted_expression_column():
    text = forward_text("where(x > 0, x, alpa * x)", quoted=True)
    check(dsl_error(text), line_of(text, "alpa"), col=col_of(text, "alpa"))


@pytest.mark.parametrize("value", [
    "where(x > 0,\n       x, alpa * x)",
    ">\n    where(x > 0, x, alpa * x)",
    "|\n    where(x > 0,\n          x, alpa * x)",
], ids=["plain", "folded", "literal"])
def test_multi_line_expression_error_line(value):
    text = decl((Y_FORWARD, f"  y: {value}"))
    check(dsl_error(text), line_of(text, "alpa"), "undefined name 'alpa'")


def test_nan_default_is_rejected():
    text = decl((ALPHA_LINE, "  alpha: {type: float, default: .nan}"))
    check(load_error(text), line_of(text, "alpha:"), "attrs.alpha.default")


def test_empty_interval_is_rejected():
    text = decl((ALPHA_LINE, '  alpha: {type: float, range: "(1, 1)"}'))
    check(load_error(text), line_of(text, "alpha:"), "attrs.alpha.range")


def test_hand_written_backward_that_hard_codes_a_default(tmp_path):
    text = decl(append="backward:\n  x: where(x > 0, dy, 0.5 * dy)\n")  # alpha's default is 0.5
    path = _write(tmp_path, text)
    with pytest.raises(SpecError) as info:
        make_op(path)
    check(info.value, line_of(text, "0.5 * dy"), "the hand-written gradient disagrees", file=str(path))
