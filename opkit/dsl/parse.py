"""Expression text → graph nodes, through Python's `ast` module and a whitelist.

Nothing is evaluated: the parser walks the syntax tree and accepts only numbers, names it was
given, arithmetic, comparisons, `&`/`|`/`~`, `a if c else b` and calls of the DSL's functions.
Every rejection points at the offending column of the user's expression with a caret.
"""
from __future__ import annotations

import ast
import io
import math
import tokenize
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple, Union

from ..errors import Loc, SpecError
from .ir import Node, const
from . import library
from .primitives import PRIMITIVES, apply
from ..kinds import Op, ValueKind

_BINOPS = {ast.Add: Op.ADD, ast.Sub: Op.SUB, ast.Mult: Op.MUL, ast.Div: Op.DIV,
           ast.BitAnd: Op.AND, ast.BitOr: Op.OR}
_CMPOPS = {ast.Gt: Op.GT, ast.GtE: Op.GE, ast.Lt: Op.LT, ast.LtE: Op.LE, ast.Eq: Op.EQ,
           ast.NotEq: Op.NE}
F, B = ValueKind.FLOAT, ValueKind.BOOL
CONSTANTS = {"pi": math.pi, "e": math.e, "inf": math.inf}
def _primitive_builder(name: Op) -> Callable[..., Node]:
    return lambda *args: apply(name, *args)


# functions of the language: name -> (number of arguments, builder). The elementwise ones come
# from the primitive records (Primitive.function); the library calls and aliases are here.
_FUNCTIONS: Dict[str, tuple] = {
    **{p.function: (len(p.arg_kinds), _primitive_builder(p.name))
       for p in PRIMITIVES.values() if p.function},
    "minimum": (2, _primitive_builder(Op.MIN)),   # NumPy's spellings
    "maximum": (2, _primitive_builder(Op.MAX)),
    "matmul": (2, library.matmul),
    "sum": (2, library.dsl_sum),
    "fft_up": (3, library.fft_up),
    "fft_down": (3, library.fft_down),
    "mean": (2, library.dsl_mean),
    "amax": (2, library.dsl_amax),
    "amin": (2, library.dsl_amin),
    "logsumexp": (2, library.dsl_logsumexp),
    "conv2d": (4, library.conv2d),
    "conv_transpose2d": (4, library.conv_transpose2d),
}
FUNCTION_NAMES = tuple(sorted(_FUNCTIONS)) + tuple(sorted(CONSTANTS))
_REDUCING = {"max": "amax", "min": "amin"}  # max(v, D) over a dim D: amax(v, D)


_EXCERPT = 100  # characters of an expression an error message shows


@dataclass
class Source:
    """Where an expression came from, for error messages with a caret."""

    text: str
    loc: Loc
    what: str           # e.g. "forward.y"
    pieces: tuple = ()  # (text offset, line, col) where each source line of the text begins

    def position(self, offset: int) -> Loc:
        if not self.pieces:
            return Loc(self.loc.file, self.loc.line, self.loc.col + offset)
        start, line, col = max((p for p in self.pieces if p[0] <= offset), default=self.pieces[0])
        return Loc(self.loc.file, line, col + max(offset - start, 0))

    def error(self, message: str, node: Optional[ast.AST] = None) -> SpecError:
        # the text is parsed as one line (line breaks become spaces), so col_offset is an offset
        offset = getattr(node, "col_offset", 0) if node is not None else 0
        flat = self.text.replace("\n", " ")
        # a long expression is shown around the caret
        start = max(0, min(offset - _EXCERPT // 2, len(flat) - _EXCERPT))
        shown = ("..." if start else "") + flat[start:start + _EXCERPT] + \
            ("..." if start + _EXCERPT < len(flat) else "")
        excerpt = f"    {shown}\n    {' ' * (offset - start + (3 if start else 0))}^"
        return SpecError(f"{self.what}: {message}", self.position(offset), excerpt)


@dataclass(frozen=True)
class Specialization:
    """What is known when a variant's expressions are parsed: the value of each str attr (and
    its choices), and which optional inputs the variant gives. Comparisons of a str attr with a
    string and `is_given(name)` fold to constants (opkit/dsl/variants.py)."""

    strings: Tuple[Tuple[str, str, Tuple[str, ...]], ...] = ()   # (attr, value, choices)
    optional: Tuple[Tuple[str, bool], ...] = ()                  # (input, given)

    def string(self, name: str):
        return next(((v, c) for n, v, c in self.strings if n == name), None)

    def given(self, name: str) -> Optional[bool]:
        return next((g for n, g in self.optional if n == name), None)


# dtype limits an expression may name, as NumPy's finfo of the call's float dtype
FINFO = ("max", "min", "eps", "tiny")


class _Parser:
    def __init__(self, src: Source, names: Dict[str, Node], special: Specialization):
        self.src, self.names, self.special = src, names, special
        self.done: Dict[int, Node] = {}  # id of an ast node -> its graph node

    def expr(self, root: ast.AST) -> Node:
        """The graph node of an expression. The walk keeps its own stack: a sum of a thousand
        terms is a thousand BinOps deep."""
        stack = [(root, False)]
        while stack:
            node, ready = stack.pop()
            if ready:
                self.done[id(node)] = getattr(self, "_" + type(node).__name__)(node)
            else:
                stack.append((node, True))
                stack.extend((child, False) for child in reversed(self.operands(node)))
        return self.done[id(root)]

    def value(self, node: ast.AST) -> Node:
        return self.done[id(node)]

    def operands(self, node: ast.AST) -> List[ast.AST]:
        """The subexpressions to evaluate before `node` (checking first what needs no values)."""
        if isinstance(node, (ast.Constant, ast.Name)) or self._string_test(node) or \
                self._finfo(node) or (isinstance(node, ast.Call) and
                                      getattr(node.func, "id", None) == "is_given"):
            return []
        if isinstance(node, ast.BinOp):
            return [node.left, node.right]
        if isinstance(node, ast.UnaryOp):
            return [node.operand]
        if isinstance(node, ast.Compare):
            return [node.left, *node.comparators]
        if isinstance(node, ast.BoolOp):
            return list(node.values)
        if isinstance(node, ast.IfExp):
            return [node.test, node.body, node.orelse]
        if isinstance(node, ast.Call):
            return self._call_operands(node)
        raise self.src.error(f"{_describe(node)} is not part of the expression language; "
                             "use numbers, names, + - * / **, comparisons, & | ~, "
                             f"and the functions {', '.join(sorted(_FUNCTIONS))}", node)

    def loc(self, node: ast.AST) -> Loc:
        return self.src.position(getattr(node, "col_offset", 0))

    def need(self, value: Node, kind: ValueKind, node: ast.AST, role: str) -> Node:
        if value.kind != kind:
            if kind == ValueKind.FLOAT:
                raise self.src.error(f"{role} must be a number, but this is a true/false condition; "
                                     "turn a condition into a number with where(cond, a, b)", node)
            raise self.src.error(f"{role} must be a true/false condition (a comparison such as "
                                 "x > 0), but this is a number", node)
        return value

    def build(self, prim: Op, node: ast.AST, *args: Node) -> Node:
        return apply(prim, *args, loc=self.loc(node))

    # --- leaves
    def _Constant(self, node: ast.Constant) -> Node:
        v = node.value
        if isinstance(v, bool):
            return const(v, B)
        if isinstance(v, (int, float)):
            return const(float(v))
        if isinstance(v, str):
            raise self.src.error(f"a string such as {v!r} can only be compared with a str attr "
                                 '(approximate == "tanh")', node)
        raise self.src.error(f"the constant {v!r} is not a number", node)

    def _Name(self, node: ast.Name) -> Node:
        if self.special.string(node.id) is not None:
            raise self.src.error(f"{node.id} is a str attr: compare it with one of its choices, "
                                 f'as in `a if {node.id} == "..." else b`', node)
        if node.id in self.names:
            return self.names[node.id]
        if node.id in CONSTANTS:
            return const(CONSTANTS[node.id])
        known = sorted(self.names)
        import difflib
        # a name in scope at the usual closeness; a function name only when nearly the same
        close = (difflib.get_close_matches(node.id, known, n=1) or
                 difflib.get_close_matches(node.id, list(_FUNCTIONS), n=1, cutoff=0.8))
        hint = f"; did you mean {close[0]!r}?" if close else (f"; known names: {', '.join(known)}" if known else "")
        raise self.src.error(f"undefined name {node.id!r}{hint}", node)

    def _finfo(self, node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
            node.value.id == "finfo"

    def _Attribute(self, node: ast.Attribute) -> Node:
        if node.attr not in FINFO:
            raise self.src.error(f"finfo.{node.attr} is not known; the dtype limits are "
                                 f"{', '.join('finfo.' + w for w in FINFO)}", node)
        # a number of the call's dtype (65504 for float16): the runtime passes it like an attr
        return Node(Op.ATTR, (), (f"finfo.{node.attr}",), ValueKind.FLOAT, (), self.loc(node))

    def _string_test(self, node: ast.AST) -> bool:
        """A comparison of a str attr with a string: decided when the variant is compiled."""
        return isinstance(node, ast.Compare) and any(
            isinstance(side, ast.Constant) and isinstance(side.value, str)
            for side in [node.left, *node.comparators])

    def _string_compare(self, node: ast.Compare) -> Node:
        sides = [node.left, *node.comparators]
        if len(node.ops) != 1 or not isinstance(node.ops[0], (ast.Eq, ast.NotEq)):
            raise self.src.error("a string can only be compared once, with == or !=", node)
        name = next((s for s in sides if isinstance(s, ast.Name)), None)
        text = next((s for s in sides if isinstance(s, ast.Constant) and isinstance(s.value, str)),
                    None)
        known = self.special.string(name.id) if name is not None else None
        if name is None or known is None or text is None:
            raise self.src.error("a string can only be compared with a str attr, as in "
                                 'approximate == "tanh"', node)
        value, choices = known
        if text.value not in choices:
            raise self.src.error(f"{text.value!r} is not a choice of {name.id} "
                                 f"({', '.join(map(repr, choices))})", text)
        return const((value == text.value) == isinstance(node.ops[0], ast.Eq), B)

    def _is_given(self, node: ast.Call) -> Node:
        if len(node.args) != 1 or node.keywords or not isinstance(node.args[0], ast.Name):
            raise self.src.error("is_given() takes the name of an optional input", node)
        name = node.args[0].id
        given = self.special.given(name)
        if given is None:
            what = "an input that is not optional: declare it `optional: true`" \
                if name in self.names and self.names[name].op == Op.INPUT else "not an optional input"
            raise self.src.error(f"is_given({name}): {name} is {what}", node.args[0])
        return const(given, B)

    # --- operators
    def _BinOp(self, node: ast.BinOp) -> Node:
        left, right = self.value(node.left), self.value(node.right)
        if isinstance(node.op, ast.Pow):
            self.need(left, F, node.left, "the base of **")
            self.need(right, F, node.right, "the exponent of **")
            if not right.is_const:
                return self.build(Op.POW, node, left, right)
            if right.value == 0.0:
                return const(1.0)  # as pow(x, 0) is 1 for every x, NaN included
            if right.value == 1.0:
                return left
            if right.value == 2.0:
                return self.build(Op.MUL, node, left, left)
            return self.build(Op.POW, node, left, right)
        prim = _BINOPS.get(type(node.op))
        if prim is None:
            at = self._operator_at(node)
            if isinstance(node.op, ast.BitXor):
                raise self.src.error("^ is not a power here: write a ** b (or exp(x) for e ** x)", at)
            raise self.src.error(f"the operator {_describe(node.op)} is not supported", at)
        kind = B if prim in (Op.AND, Op.OR) else F
        role = "each side of & and |" if kind == B else f"each side of {_symbol(node.op)}"
        if kind == B and F in (left.kind, right.kind):
            raise self.src.error("each side of & and | must be a true/false condition; & and | bind "
                                 "tighter than comparisons, so write (x > 0) & (x < 1)", node)
        self.need(left, kind, node.left, role)
        self.need(right, kind, node.right, role)
        return self.build(prim, node, left, right)

    def _operator_at(self, node: ast.BinOp) -> ast.AST:
        """A stand-in node whose column is the binary operator's own (for the caret)."""
        flat = self.src.text.replace("\n", " ")
        start = getattr(node.left, "end_col_offset", node.col_offset)
        symbol = _describe(node.op)
        col = flat.find(symbol, start, node.right.col_offset)
        at = ast.Constant(0)
        at.lineno, at.col_offset = 1, col if col >= 0 else node.col_offset
        return at

    def _UnaryOp(self, node: ast.UnaryOp) -> Node:
        operand = self.value(node.operand)
        if isinstance(node.op, ast.UAdd):
            return self.need(operand, F, node.operand, "the operand of +")
        if isinstance(node.op, ast.USub):
            return self.build(Op.NEG, node, self.need(operand, F, node.operand, "the operand of -"))
        return self.build(Op.NOT, node, self.need(operand, B, node.operand, "the operand of ~ / not"))

    def _Compare(self, node: ast.Compare) -> Node:
        if self._string_test(node):
            return self._string_compare(node)
        result = None
        left = self.value(node.left)
        left_ast = node.left
        for op, right_ast in zip(node.ops, node.comparators):
            prim = _CMPOPS.get(type(op))
            if prim is None:
                raise self.src.error(f"the comparison {_describe(op)} is not supported", node)
            right = self.value(right_ast)
            self.need(left, F, left_ast, "each side of a comparison")
            self.need(right, F, right_ast, "each side of a comparison")
            cmp = self.build(prim, node, left, right)
            result = cmp if result is None else self.build(Op.AND, node, result, cmp)
            left, left_ast = right, right_ast
        assert result is not None  # Python's grammar gives a comparison at least one operator
        return result

    def _BoolOp(self, node: ast.BoolOp) -> Node:
        prim = Op.AND if isinstance(node.op, ast.And) else Op.OR
        values = [self.need(self.value(v), B, v, f"each operand of {prim}")
                  for v in node.values]
        result = values[0]
        for v in values[1:]:
            result = self.build(prim, node, result, v)
        return result

    def _IfExp(self, node: ast.IfExp) -> Node:
        branch = "each branch of `a if c else b`"
        cond = self.need(self.value(node.test), B, node.test,
                         "the condition of `a if c else b`")
        a = self.need(self.value(node.body), F, node.body, branch)
        b = self.need(self.value(node.orelse), F, node.orelse, branch)
        return self.build(Op.WHERE, node, cond, a, b)

    def _call_operands(self, node: ast.Call) -> List[ast.AST]:
        if not isinstance(node.func, ast.Name):
            raise self.src.error("only the language's functions can be called, by plain name", node.func)
        fname = node.func.id
        if fname == "is_given":
            return []
        if fname not in _FUNCTIONS:
            import difflib
            close = difflib.get_close_matches(fname, list(_FUNCTIONS), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise self.src.error(f"unknown function {fname!r}{hint}; the functions are: "
                                 f"{', '.join(sorted(_FUNCTIONS))}", node.func)
        if node.keywords:
            raise self.src.error(f"{fname}() takes positional arguments only", node.keywords[0].value)
        nargs = _FUNCTIONS[fname][0]
        if len(node.args) != nargs:
            raise self.src.error(f"{fname}() takes {nargs} argument{'s' * (nargs != 1)}, "
                                 f"got {len(node.args)}", node)
        starred = next((a for a in node.args if isinstance(a, ast.Starred)), None)
        if starred is not None:
            raise self.src.error("* arguments are not supported", starred)
        _, _, kinds = self._form(node)
        return [a for a, kind in zip(node.args, kinds) if kind != "dim"]

    def _form(self, node: ast.Call) -> Tuple[Callable, str, Tuple[str, ...]]:
        """(builder, its name, argument kinds) of a call: `max(v, D)` and `min(v, D)` whose D is
        a name that holds no value (a dim name) are the reductions amax and amin."""
        fname = _callee(node)
        last = node.args[-1] if node.args else None
        if fname in _REDUCING and len(node.args) == 2 and isinstance(last, ast.Name) and \
                last.id not in self.names and last.id not in CONSTANTS:
            fname = _REDUCING[fname]
        nargs, builder = _FUNCTIONS[fname]
        return builder, fname, _CALL_KINDS.get(fname, (F,) * nargs)

    def _Call(self, node: ast.Call) -> Node:
        if _callee(node) == "is_given":
            return self._is_given(node)
        builder, fname, kinds = self._form(node)
        args: List[Union[str, Node]] = []  # dim names and values
        for i, (a, kind) in enumerate(zip(node.args, kinds)):
            if kind == "dim":  # a dim name such as H or K, not a value
                if not isinstance(a, ast.Name):
                    raise self.src.error(f"argument {i + 1} of {fname}() must be a dim name such as "
                                         "H, W or K", a)
                args.append(a.id)
                continue
            value = self.value(a)
            if kind == "scalar":
                if value.op not in (Op.ATTR, Op.CONST) or value.kind != ValueKind.FLOAT:
                    raise self.src.error(f"argument {i + 1} of {fname}() must be an attr or a "
                                         "number", a)
            elif kind != "any":
                self.need(value, ValueKind(kind), a, f"argument {i + 1} of {fname}()")
            args.append(value)
        try:
            result = builder(*args)
        except SpecError:
            raise
        except ValueError as exc:
            raise self.src.error(str(exc), node) from None
        if result.loc is None and not result.is_const:
            result.loc = self.loc(node)
        return result


# the kind of each argument of a call: a ValueKind, or "dim" (a dim name), "scalar" (an attr or
# a number), "any"
_CALL_KINDS: Dict[str, Tuple[str, ...]] = {
    "sum": (F, "dim"), "fft_up": (F, "dim", "scalar"), "fft_down": (F, "dim", "scalar"),
    "mean": (F, "dim"), "amax": (F, "dim"), "amin": (F, "dim"), "logsumexp": (F, "dim"),
    "conv2d": (F, F, "scalar", "scalar"), "conv_transpose2d": (F, F, "scalar", "scalar"),
    **{p.function: p.arg_kinds for p in PRIMITIVES.values() if p.function}}


def _callee(node: ast.Call) -> str:
    """The name a call calls; operands() lets only calls of plain names through."""
    assert isinstance(node.func, ast.Name)
    return node.func.id


def _describe(node) -> str:
    names = {"Subscript": "indexing ([...])", "Attribute": "attribute access (a.b)",
             "Lambda": "lambda", "ListComp": "a list comprehension", "List": "a list",
             "Tuple": "a tuple", "Dict": "a dict", "Set": "a set", "Starred": "*args",
             "NamedExpr": "the := operator", "JoinedStr": "an f-string", "Await": "await",
             "Mod": "%", "FloorDiv": "//", "MatMult": "@", "LShift": "<<", "RShift": ">>",
             "BitXor": "^", "Is": "is", "IsNot": "is not", "In": "in", "NotIn": "not in",
             "GeneratorExp": "a generator", "Yield": "yield"}
    return names.get(type(node).__name__, type(node).__name__)


def _symbol(op) -> str:
    return {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}.get(type(op), "?")


# Python builds the syntax tree of `a + b + c ...` recursively, one level per operator, and
# gives up somewhere past a few thousand (depending on the version and the caller's stack): an
# expression longer than this is refused up front, with the same answer everywhere.
MAX_OPERATORS = 1000
_OPERATOR_WORDS = frozenset(("and", "or", "not", "if", "is", "in", "lambda"))
_PUNCTUATION = frozenset("()[]{},:;.")


def _check_length(src: Source, flat: str) -> None:
    count = 0
    try:
        for tok in tokenize.generate_tokens(io.StringIO(flat).readline):
            if (tok.type == tokenize.OP and tok.string not in _PUNCTUATION) or \
                    (tok.type == tokenize.NAME and tok.string in _OPERATOR_WORDS):
                count += 1
                if count > MAX_OPERATORS:
                    raise _too_long(src, tok.start[1], f"the expression has more than "
                                    f"{MAX_OPERATORS} operators (the limit for one expression)")
    except (tokenize.TokenError, SyntaxError):
        return  # not Python's syntax: ast.parse says where


def _too_long(src: Source, offset: int, what: str) -> SpecError:
    at = ast.Constant(0)
    at.lineno, at.col_offset = 1, offset
    return src.error(f"{what}; compute parts of it on earlier lines (`t1: ...`, then "
                     "`y: t1 + ...`)", at)


def parse_expr(src: Source, names: Dict[str, Node],
               special: Specialization = Specialization()) -> Node:
    """Parse one expression; `names` maps the names in scope to their nodes; `special` says
    what a variant decides (str attr values, optional inputs given)."""
    if not src.text.strip():
        raise src.error("the expression is empty")
    # one line, same length: a character offset is a column and maps back through src.pieces
    flat = src.text.replace("\n", " ").rstrip()
    _check_length(src, flat)
    try:
        tree = ast.parse(flat, mode="eval")
    except SyntaxError as exc:
        fake = ast.Constant(0)
        fake.lineno, fake.col_offset = 1, max((exc.offset or 1) - 1, 0)
        raise src.error(f"syntax error: {exc.msg}", fake) from None
    except (RecursionError, MemoryError):
        raise _too_long(src, 0, "the expression is too long for Python's parser") from None
    return _Parser(src, names, special).expr(tree.body)
