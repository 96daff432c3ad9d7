"""Stage 1: YAML declarations → checked, frozen OpSpec dataclasses with source locations."""
from .load import load_spec, parse_spec
from .model import (DTYPES, FLOAT_DTYPES, INT_DTYPES, LAYOUT_DIMS, LAYOUT_PHYSICAL, LAYOUTS,
                    AttrSpec, Binding, InputSpec, Interval, OpSpec, OutputSpec, ScheduleSpec)

__all__ = ["load_spec", "parse_spec", "OpSpec", "InputSpec", "AttrSpec", "OutputSpec", "Binding",
           "ScheduleSpec", "Interval", "DTYPES", "FLOAT_DTYPES", "INT_DTYPES", "LAYOUTS",
           "LAYOUT_DIMS", "LAYOUT_PHYSICAL"]
