"""Stage 4: kernel plans → Cython source with annotation headers."""
from ..abi import COMPUTE, DTYPE_CODES, TAG_CODES
from .render import instance_tag, render, template_digest

__all__ = ["render", "template_digest", "COMPUTE", "DTYPE_CODES", "TAG_CODES", "instance_tag"]
