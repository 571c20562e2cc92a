"""torch's sympy helpers for symbolic sizes: its infinity (torch.utils._sympy.numbers.int_oo) and
value ranges (torch.utils._sympy.value_ranges.ValueRanges)."""

from torch.utils._sympy.numbers import int_oo
from torch.utils._sympy.value_ranges import ValueRanges

__all__ = ["ValueRanges", "int_oo"]
