"""Process-wide settings, a context manager that overrides them, and per-call keywords on top."""
from __future__ import annotations

import contextlib
import contextvars
import difflib
import os
from typing import Any, Dict, Iterator, Optional


def _default_threads() -> int:
    env = os.environ.get("OPKIT_NUM_THREADS")
    if env:
        try:
            n = int(env)
        except ValueError:
            raise ValueError(f"OPKIT_NUM_THREADS must be a positive integer, got {env!r}") from None
        if n >= 1:
            return n
        raise ValueError(f"OPKIT_NUM_THREADS must be a positive integer, got {env!r}")
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _check_threads(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"num_threads must be a positive integer, got {v!r}")
    return v


# native: every feature of this CPU; portable: the architecture's baseline only; x86-64-v3: the
# x86-64 level with AVX2, FMA and F16C, which shipped modules are also built for (opkit/target.py)
ISAS = ("native", "portable", "x86-64-v3")


def _default_isa() -> str:
    return os.environ.get("OPKIT_ISA") or "native"


def _check_isa(v: Any) -> str:
    if v not in ISAS:
        raise ValueError(f"isa must be one of {', '.join(map(repr, ISAS))}, got {v!r}")
    return v


PRECISION_MODES = ("must_keep_origin_dtype", "force_fp16", "force_fp32", "allow_fp32_to_fp16",
                   "allow_mix_precision")
DEFAULT_PRECISION = PRECISION_MODES[0]


def check_precision_mode(v: Any) -> str:
    if v not in PRECISION_MODES:
        raise ValueError(f"precision_mode must be one of {', '.join(PRECISION_MODES)}; got {v!r}")
    return v


def _check_bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"alpha_quant must be True or False, got {v!r}")
    return v


# name -> (default factory, checker)
_SETTINGS = {
    "num_threads": (_default_threads, _check_threads),
    "isa": (_default_isa, _check_isa),
    "precision_mode": (lambda: DEFAULT_PRECISION, check_precision_mode),
    "alpha_quant": (lambda: False, _check_bool),
}
_global: Dict[str, Any] = {}
_context: contextvars.ContextVar = contextvars.ContextVar("opkit_config", default={})


def _validate(kwargs: Dict[str, Any]) -> Dict[str, Any]:
    out = {}
    for key, value in kwargs.items():
        if key not in _SETTINGS:
            close = difflib.get_close_matches(key, list(_SETTINGS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"unknown opkit setting {key!r}{hint}; the settings are: "
                             f"{', '.join(sorted(_SETTINGS))}")
        out[key] = _SETTINGS[key][1](value)
    return out


def configure(settings: Optional[Dict[str, Any]] = None, **kwargs) -> None:
    """Change settings for the whole process: configure(num_threads=1) or configure({...})."""
    merged = dict(settings or {})
    merged.update(kwargs)
    _global.update(_validate(merged))
    _STATE.clear()


@contextlib.contextmanager
def config(settings: Optional[Dict[str, Any]] = None, **kwargs) -> Iterator[None]:
    """Override settings inside a `with` block (this thread / task only)."""
    merged = dict(settings or {})
    merged.update(kwargs)
    token = _context.set({**_context.get(), **_validate(merged)})
    try:
        yield
    finally:
        _context.reset(token)


def get(name: str) -> Any:
    ctx = _context.get()
    if ctx and name in ctx:
        return ctx[name]
    try:
        return _global[name]
    except KeyError:
        _global[name] = _SETTINGS[name][0]()
        return _global[name]


def plain() -> bool:
    """Default precision and no slope quantization: the direct call may run."""
    return get("precision_mode") == DEFAULT_PRECISION and not get("alpha_quant")


_STATE: list = []  # the process-wide (isa, num_threads, plain), kept while no block overrides


def call_state():
    """(isa, num_threads, plain) for the call being made, cheaply: every operator call asks."""
    if not _context.get():
        if not _STATE:
            _STATE.append((get("isa"), get("num_threads"), plain()))
        return _STATE[0]
    return get("isa"), get("num_threads"), plain()


def current() -> Dict[str, Any]:
    """Every setting's effective value here and now."""
    return {name: get(name) for name in sorted(_SETTINGS)}


def reset() -> None:
    """Back to the defaults (environment variables are read again)."""
    _global.clear()
    _STATE.clear()
