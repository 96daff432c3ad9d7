"""Shipping operators: modules built ahead of time (aot), operator packages as wheels (wheel)
and their discovery through the entry point group opkit.operators (plugins)."""
