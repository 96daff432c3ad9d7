"""Exceptions that opkit raises to its users."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple


@dataclass(frozen=True)
class Loc:
    """A place in a declaration file: 1-based line and column."""

    file: str
    line: int
    col: int = 0

    def __str__(self) -> str:
        return f"{self.file}:{self.line}" + (f":{self.col}" if self.col else "")


class SpecError(ValueError):
    """A bad operator declaration. The message names the file, the line and what was expected."""

    def __init__(self, message: str, loc: Optional[Loc] = None, excerpt: str = ""):
        self.loc = loc
        self.reason = message
        self.errors: Tuple[SpecError, ...] = (self,)  # every error this one reports (several for a folder)
        text = f"{loc}: {message}" if loc else message
        if excerpt:
            text += "\n" + excerpt
        super().__init__(text)

    @classmethod
    def combine(cls, errors: Sequence["SpecError"]) -> "SpecError":
        """One error that reports each of `errors` (a folder with several bad files)."""
        if len(errors) == 1:
            return errors[0]
        lines = [f"{len(errors)} declarations have errors:"]
        for error in errors:
            lines += ["  " + line for line in str(error).splitlines()]
        combined = cls("\n".join(lines))
        combined.errors = tuple(errors)
        return combined


class FusionWarning(UserWarning):
    """Elementwise work after a conv2d or matmul that does not run in the call's epilogue:
    "Cannot fuse <consumer> with preceding op <producer> (<file>:<line>): <reason>"."""


class BuildError(RuntimeError):
    """Generating or compiling a kernel module failed; the message shows where and why."""

    # why each shipped module that could have served was refused, where a build found none to
    # use (the fallback to another ISA's shipped module reports these); set by the builder
    refused: List[str]
