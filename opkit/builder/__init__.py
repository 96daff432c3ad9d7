"""Stage 5: Cython source → compiled module in the content-hashed cache (the build stage)."""
from .cache import cache_root, clean, load_module
from .compile import BuildResult, build, content_key, key_for
from .toolchain import Toolchain, toolchain

__all__ = ["build", "BuildResult", "key_for", "content_key", "toolchain", "Toolchain", "cache_root",
           "clean", "load_module"]
