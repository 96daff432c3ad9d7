"""Stage 6: checked calls into compiled kernels (argument checks, layouts, out=, dispatch)."""
from .bind import Bound, bind
from .execute import Executor
from .op import Op

__all__ = ["Op", "Bound", "bind", "Executor"]
