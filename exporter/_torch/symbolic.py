"""torch's helpers for symbolic sizes: its infinity (torch.utils._sympy.numbers.int_oo), value ranges
(torch.utils._sympy.value_ranges.ValueRanges) and contiguity tests that add no guard (torch._prims_common)."""

from torch._prims_common import is_channels_last_contiguous_or_false, is_contiguous_or_false
from torch.utils._sympy.numbers import int_oo
from torch.utils._sympy.value_ranges import ValueRanges

__all__ = ["ValueRanges", "int_oo", "is_channels_last_contiguous_or_false", "is_contiguous_or_false"]
