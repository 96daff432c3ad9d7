"""The lowered form of a pass: fused elementwise kernels and library calls, in order."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Tuple, Union

from ..errors import Loc


@dataclass(frozen=True)
class Instr:
    """One SSA step of a kernel body: dst = op(args)."""

    dst: str                      # v0, v1 ...
    op: str                       # a primitive name, or "load" / "attr" / "const"
    args: Tuple[str, ...]         # SSA names (for "load": the operand index as text)
    kind: str                     # float | bool
    value: object = None          # the constant of a "const", the attr name of an "attr"
    loc: Optional[Loc] = None


@dataclass(frozen=True)
class Schedule:
    """How a kernel runs; it never changes the result (each element is computed the same way)."""

    tile: int                     # elements per tile in the converting / strided path
    parallel_threshold: int       # below this many elements one thread runs
    max_threads: Optional[int]    # None: every core opkit may use
    vector_bytes: int             # vector register width of the target
    isa: str                      # what the kernel is compiled for

    def lanes(self, itemsize: int) -> int:
        return max(self.vector_bytes // itemsize, 1)


@dataclass(frozen=True)
class Kernel:
    name: str                     # fwd0, bwd0 ...
    inputs: Tuple[str, ...]       # values read (input names or temps)
    outputs: Tuple[str, ...]      # values written
    attrs: Tuple[str, ...]        # attrs the body uses, in argument order
    body: Tuple[Instr, ...]
    results: Tuple[str, ...]      # the SSA name stored to each output
    schedule: Schedule
    locs: Tuple[Loc, ...] = ()    # declaration lines this kernel comes from

    @property
    def operands(self) -> Tuple[str, ...]:
        return self.inputs + self.outputs

    @property
    def prologue(self) -> Tuple[Instr, ...]:
        """The steps computed from attrs and constants alone: float kernels compute them once per
        call in double precision before rounding to the compute type (1e20 * 1e20 / 1e30 fits
        float32 only if the product is not rounded on the way)."""
        scalar, out = set(), []
        for ins in self.body:
            if ins.op != "load" and all(a.startswith(("@", "#")) or a in scalar for a in ins.args):
                scalar.add(ins.dst)
                out.append(ins)
        return tuple(out)

    @property
    def prologue_results(self) -> Tuple[str, ...]:
        """The prologue values the element loop reads (the others are steps on the way)."""
        hoisted = {i.dst for i in self.prologue}
        used = [a for i in self.body if i.dst not in hoisted for a in i.args] + list(self.results)
        return tuple(d for d in (i.dst for i in self.prologue) if d in used)

    @property
    def loop_attrs(self) -> Tuple[str, ...]:
        """The attrs the element loop reads as they are (not only through the prologue)."""
        hoisted = {i.dst for i in self.prologue}
        used = {a[1:] for i in self.body if i.dst not in hoisted for a in i.args if a[:1] == "@"}
        used |= {r[1:] for r in self.results if r[:1] == "@"}
        return tuple(a for a in self.attrs if a in used)

    @property
    def scalar_calls(self) -> Tuple[str, ...]:
        """The libm functions the body calls that keep its element loop scalar."""
        from ..dsl.primitives import PRIMITIVES
        return tuple(sorted({i.op for i in self.body
                             if i.op in PRIMITIVES and not PRIMITIVES[i.op].vectorizes}))


@dataclass(frozen=True)
class LibCall:
    name: str
    prim: str
    args: Tuple[str, ...]
    params: tuple
    result: str


Step = Union[Kernel, LibCall]


@dataclass(frozen=True)
class Plan:
    kind: str                                 # forward | backward
    inputs: Tuple[str, ...]
    attrs: Tuple[str, ...]
    outputs: Tuple[Tuple[str, str], ...]      # (output name, value that holds it)
    steps: Tuple[Step, ...]
    temps: Tuple[str, ...] = field(default=())

    @property
    def kernels(self) -> Tuple[Kernel, ...]:
        return tuple(s for s in self.steps if isinstance(s, Kernel))
