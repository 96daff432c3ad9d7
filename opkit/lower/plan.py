"""The lowered form of a pass: fused elementwise kernels and library calls, in order.

A plan is a pure function of the declaration: nothing in it depends on the machine. The target
(vector width, instruction set) is applied when the plan is rendered (opkit/codegen) and built.
"""
from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, field
from typing import Optional, Tuple, Union

from ..errors import Loc
from ..kinds import Op, Pass, ValueKind


class Kind(enum.Enum):
    INPUT = "input"     # an input of the pass (in a backward pass also an output gradient dy)
    OUTPUT = "output"   # a result of the pass (in a backward pass a gradient dx)
    TEMP = "temp"       # an array between two steps


@dataclass(frozen=True, eq=False)
class Value:
    """An array that a step reads or writes. There is one object per value (make them with
    Value.input, .output and .temp): equality is identity, and the runtime, which keys its
    arrays by Value on every call, hashes them at C speed."""

    kind: Kind
    name: str           # the input's or output's name (dx for a gradient), the temp's number

    def __str__(self) -> str:  # how people see it: x, dy, dx, tmp0
        return f"tmp{self.name}" if self.kind is Kind.TEMP else self.name

    # one object per value: the runtime's dict lookups then match by identity, never by __eq__
    @staticmethod
    def input(name: str) -> "Value":
        return _interned(Kind.INPUT, name)

    @staticmethod
    def output(name: str) -> "Value":
        return _interned(Kind.OUTPUT, name)

    @staticmethod
    def temp(number: int) -> "Value":
        return _interned(Kind.TEMP, str(number))


@functools.lru_cache(maxsize=None)
def _interned(kind: Kind, name: str) -> Value:
    return Value(kind, name)


@dataclass(frozen=True)
class Reg:
    """A value computed by a kernel body (SSA)."""

    number: int

    def __str__(self) -> str:
        return f"v{self.number}"


@dataclass(frozen=True)
class Attr:
    """An attr of the call, a scalar."""

    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Const:
    """A number or true/false written in the declaration."""

    value: Union[float, bool]

    def __str__(self) -> str:
        return repr(self.value)


Operand = Union[Reg, Attr, Const]
Scalar = (Attr, Const)   # operands that are the same for every element

LOAD = Op.LOAD


@dataclass(frozen=True)
class Instr:
    """One SSA step of a kernel body: dst = op(args), or dst = inputs[slot][j] for a LOAD."""

    dst: Reg
    op: Op                        # a primitive, or LOAD
    args: Tuple[Operand, ...]     # () for a LOAD
    kind: ValueKind
    loc: Optional[Loc] = None
    slot: int = -1                # LOAD: the index of the kernel input it reads

    def __post_init__(self):
        object.__setattr__(self, "op", Op(self.op))
        object.__setattr__(self, "kind", ValueKind(self.kind))


@dataclass(frozen=True)
class Schedule:
    """How kernels run, as the declaration says; it never changes a result (each element is
    computed the same way whatever the split). The vector width comes from the target."""

    tile: int                     # elements per tile in the converting / strided path
    parallel_threshold: int       # below this many float32 elements one thread runs
    max_threads: Optional[int]    # None: every core opkit may use

    def threshold(self, compute_itemsize: int) -> int:
        """The threshold for a compute type: float64 moves twice the bytes per element of
        float32, and splits from half as many elements (both measured, docs/performance.md)."""
        return self.parallel_threshold * 4 // max(compute_itemsize, 4)


@dataclass(frozen=True)
class Kernel:
    name: str                     # fwd0, bwd0 ...
    inputs: Tuple[Value, ...]     # arrays read, in slot order
    outputs: Tuple[Value, ...]    # arrays written
    attrs: Tuple[str, ...]        # attrs the body uses, in argument order
    body: Tuple[Instr, ...]
    results: Tuple[Operand, ...]  # what is stored to each output
    locs: Tuple[Loc, ...] = ()    # declaration lines this kernel comes from
    dims: Optional[Tuple[str, ...]] = None   # the named dims it iterates over (None: positional)
    in_dims: Tuple[Optional[Tuple[str, ...]], ...] = ()   # each input's named dims
    # sums of its outputs folded into its pass (lower/reduce.py): each adds up an output over
    # the dims it does not keep, tile by tile while the tile is in cache
    sums: Tuple["LibCall", ...] = ()
    # its temps that only those sums read: added up, never stored
    discarded: Tuple[Value, ...] = ()

    @property
    def reads(self) -> Tuple[Value, ...]:
        return self.inputs

    @property
    def writes(self) -> Tuple[Value, ...]:
        return self.outputs + tuple(s.result for s in self.sums)

    @functools.cached_property
    def operands(self) -> Tuple[Value, ...]:
        return self.inputs + self.outputs

    def describe_writes(self) -> str:
        """What it writes, the sums folded into its pass included (`opkit show`, the module)."""
        parts = [", ".join(str(v) for v in self.outputs if v not in self.discarded)]
        for s in self.sums:
            arg = self._shown(s.array)
            what = (f"sum_to({arg}, {s.params[0]})" if s.prim == Op.SUM_TO
                    else f"{s.prim}({arg}, keep=[{', '.join(s.params[0])}])")
            parts.append(f"{s.result} = {what} in the same pass")
        return "; ".join(p for p in parts if p)

    def _shown(self, value: Value) -> str:
        """A value a folded sum adds up: a temp never stored shows as the input it loads, or as
        the loop's value (it has no array)."""
        if value not in self.discarded:
            return str(value)
        res = self.results[self.outputs.index(value)]
        load = next((i for i in self.body if i.dst == res and i.op == LOAD), None)
        return str(self.inputs[load.slot]) if load is not None else f"({value}, not stored)"

    @functools.cached_property
    def prologue(self) -> Tuple[Instr, ...]:
        """The steps computed from attrs and constants alone: float kernels compute them once per
        call in double precision before rounding to the compute type (1e20 * 1e20 / 1e30 fits
        float32 only if the product is not rounded on the way)."""
        scalar, out = set(), []
        for ins in self.body:
            if ins.op != LOAD and all(isinstance(a, Scalar) or a in scalar for a in ins.args):
                scalar.add(ins.dst)
                out.append(ins)
        return tuple(out)

    @functools.cached_property
    def prologue_results(self) -> Tuple[Reg, ...]:
        """The prologue values the element loop reads (the others are steps on the way)."""
        hoisted = {i.dst for i in self.prologue}
        used = {a for i in self.body if i.dst not in hoisted for a in i.args} | set(self.results)
        return tuple(i.dst for i in self.prologue if i.dst in used)

    @functools.cached_property
    def loop_attrs(self) -> Tuple[str, ...]:
        """The attrs the element loop reads as they are (not only through the prologue)."""
        hoisted = {i.dst for i in self.prologue}
        used = {a.name for i in self.body if i.dst not in hoisted for a in i.args
                if isinstance(a, Attr)}
        used |= {r.name for r in self.results if isinstance(r, Attr)}
        return tuple(a for a in self.attrs if a in used)

    @property
    def ops(self) -> Tuple[Op, ...]:
        """The primitives the element loop computes (each once)."""
        return tuple(dict.fromkeys(i.op for i in self.body if i.op != LOAD))


@dataclass(frozen=True)
class LibCall:
    name: str
    prim: Op
    args: Tuple[Union[Value, Attr, Const], ...]   # arrays, or numbers (a resampling factor)
    params: tuple
    result: Value
    dims: Optional[Tuple[str, ...]] = None        # the result's named dims
    loc: Optional[Loc] = None                     # where the call is written
    arg_dims: Tuple[Optional[Tuple[str, ...]], ...] = ()   # each argument's named dims

    def __post_init__(self):
        object.__setattr__(self, "prim", Op(self.prim))

    @property
    def array(self) -> Value:
        """The array a reduction (sum, mean, sum_to ...) adds up: its first argument."""
        return self.array_arg(0)

    def array_arg(self, i: int) -> Value:
        """Argument i, an array (a TypeError if the plan has a number there)."""
        arg = self.args[i]
        if not isinstance(arg, Value):
            raise TypeError(f"{self.name}: argument {i} of {self.prim} is {arg}, not an array")
        return arg

    @property
    def reads(self) -> Tuple[Value, ...]:
        return tuple(a for a in self.args if isinstance(a, Value))

    @property
    def writes(self) -> Tuple[Value, ...]:
        return (self.result,)


@dataclass(frozen=True)
class Stat:
    """A per-channel mean that a fused call accumulates in its epilogue: `call` (a `mean` keeping
    only the channel dim) of the call's result, or of what `kernel` computes from it elementwise."""

    call: LibCall
    kernel: Optional[Kernel] = None


@dataclass(frozen=True)
class Fused:
    """A library call (conv2d) with the elementwise work that consumes its result run on each
    block of that result while it is in cache: `epilogue` reads the block (the call's result
    value) and writes its outputs; `stats` are per-channel means accumulated on the way. In the
    layouts not in `layouts` (or without a compiled backend) the parts run one after another."""

    name: str
    call: LibCall
    epilogue: Optional[Kernel]
    stats: Tuple[Stat, ...]
    channel: str                  # the dim the statistics keep
    layouts: Tuple[str, ...]      # the call layouts the epilogue fuses in
    # the parts with their means folded into kernels (lower/reduce.py's fold_sums), as they run
    # one after another; () until then
    fallback: Tuple[Union[Kernel, LibCall], ...] = ()

    @property
    def unfolded(self) -> Tuple[Union[Kernel, LibCall], ...]:
        """The steps it stands for, in an order that runs them one after another."""
        out: list = [self.call]
        for st in self.stats:
            out += [st.kernel, st.call] if st.kernel is not None else [st.call]
        return tuple(out) + ((self.epilogue,) if self.epilogue is not None else ())

    @property
    def parts(self) -> Tuple[Union[Kernel, LibCall], ...]:
        """What runs where the step does not fuse: the fallback once sums are folded."""
        return self.fallback or self.unfolded

    @property
    def kernels(self) -> Tuple[Kernel, ...]:
        return tuple(p for p in self.parts if isinstance(p, Kernel))

    @property
    def reads(self) -> Tuple[Value, ...]:
        inner = {w for p in self.unfolded for w in p.writes}
        return tuple(dict.fromkeys(r for p in self.unfolded for r in p.reads if r not in inner))

    @property
    def writes(self) -> Tuple[Value, ...]:
        return tuple(w for p in self.unfolded for w in p.writes)


@dataclass(frozen=True)
class FusionNote:
    """What became of one elementwise consumer of a conv2d or matmul result: fused into the
    call's epilogue, or why not (shown by `opkit show`, warned at build)."""

    pass_kind: Pass
    producer: str                 # conv2d, matmul
    producer_loc: Optional[Loc]
    consumer: str                 # the consuming primitive (add, where ...) or library call
    loc: Optional[Loc]            # where the consumer is written
    fused: bool
    reason: str                   # how it fused, or why it cannot

    def where(self) -> str:
        loc = self.loc or self.producer_loc
        return f"{loc.file}:{loc.line}" if loc is not None else "?"

    def __str__(self) -> str:
        if self.fused:
            return f"{self.consumer} ({self.where()}): {self.reason}"
        return (f"Cannot fuse {self.consumer} with preceding op {self.producer} ({self.where()}): "
                f"{self.reason}")


Step = Union[Kernel, LibCall, Fused]


@dataclass(frozen=True)
class Plan:
    kind: Pass
    inputs: Tuple[str, ...]
    attrs: Tuple[str, ...]
    outputs: Tuple[Tuple[str, Value], ...]    # (output name, value that holds it)
    steps: Tuple[Step, ...]
    temps: Tuple[Value, ...] = field(default=())

    fusion: Tuple[FusionNote, ...] = ()

    @property
    def kernels(self) -> Tuple[Kernel, ...]:
        """Every kernel, those inside fused steps included (each is compiled)."""
        out = []
        for s in self.steps:
            out += [s] if isinstance(s, Kernel) else list(s.kernels) if isinstance(s, Fused) else []
        return tuple(out)
