"""Variants: the compile-time specializations of an operator.

A str attr (`approximate: {type: str, choices: [none, tanh]}`) and an optional input decide, at
compile time, what the kernels compute: `tanh_gelu if approximate == "tanh" else exact_gelu` and
`max if is_given(max) else finfo.max` are folded to one branch. Each combination (a *variant*)
gets graphs and kernels of its own, and a call picks its variant from the attr's value and the
inputs it gives: no string is compared and no presence is tested per element.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import List, Mapping, Tuple

from ..errors import SpecError
from ..kinds import AttrType
from ..spec.model import OpSpec

# Every variant is compiled into the operator's module: keep the product of the choices small.
MAX_VARIANTS = 16


@dataclass(frozen=True)
class Variant:
    index: int                               # position among the operator's variants
    choices: Tuple[Tuple[str, str], ...]     # (str attr, its value)
    given: Tuple[str, ...]                   # the optional inputs present
    optional: Tuple[str, ...] = ()           # every optional input of the operator

    def label(self) -> str:
        """How reports name the variant: `approximate=tanh, min given, max not given`."""
        parts = [f"{a}={v}" for a, v in self.choices]
        parts += [f"{n} {'given' if n in self.given else 'not given'}" for n in self.optional]
        return ", ".join(parts)

    def direct(self, fn: str) -> str:
        """The name of this variant's direct call `fn` in a module of several variants
        (`fast_forward_v1`): the template defines it, the runtime looks it up."""
        return f"{fn}_v{self.index}"

    @property
    def prefix(self) -> str:
        """What kernel names of this variant start with (nothing for the first)."""
        return f"v{self.index}" if self.index else ""


def variants(spec: OpSpec) -> Tuple[Variant, ...]:
    """Every variant of `spec`; the first has every str attr at its default (else its first
    choice) and no optional input."""
    axes: List[List[Tuple[str, str]]] = []
    for a in spec.attrs:
        if a.type == AttrType.STR:
            first = a.default if isinstance(a.default, str) else a.choices[0]
            axes.append([(a.name, first)] + [(a.name, c) for c in a.choices if c != first])
    optional = [i.name for i in spec.inputs if i.optional]
    count = 2 ** len(optional)
    for axis in axes:
        count *= len(axis)
    if count > MAX_VARIANTS:
        raise SpecError(f"the str attrs' choices and the optional inputs make {count} variants, "
                        f"each compiled into the module; at most {MAX_VARIANTS} are supported: "
                        "split the operator", spec.loc)
    out: List[Variant] = []
    for given in itertools.product((False, True), repeat=len(optional)):
        present = tuple(n for n, g in zip(optional, given) if g)
        for choice in itertools.product(*axes):
            out.append(Variant(len(out), tuple(choice), present, tuple(optional)))
    return tuple(out)


def pick(all_variants: Tuple[Variant, ...], choices: Mapping[str, object],
         given: Tuple[str, ...]) -> Variant:
    """The variant for a call's str attr values (`choices`: the call's attrs, of which the str
    ones are read) and the optional inputs it gives."""
    for v in all_variants:
        if v.given == given and all(choices[a] == value for a, value in v.choices):
            return v
    raise KeyError((choices, given))  # unreachable for checked values
