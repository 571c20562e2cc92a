"""torch's helpers for symbolic sizes: its infinity (torch.utils._sympy.numbers.int_oo), value ranges and
their bounds (torch.utils._sympy.value_ranges) and contiguity tests that add no guard (torch._prims_common)."""

from torch._prims_common import is_channels_last_contiguous_or_false, is_contiguous_or_false
from torch.utils._sympy.numbers import int_oo
from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy


def sympy_function_names() -> frozenset:
    """The names of the sympy functions torch's symbolic shapes are written with
    (torch.utils._sympy.functions: FloorDiv, ToFloat, FloatTrueDiv, OpaqueUnaryFn_sqrt, BitwiseFn_*, ...),
    as this torch defines them."""
    import sympy
    from torch.utils._sympy import functions

    return frozenset(name for name, value in vars(functions).items()
                     if isinstance(value, type) and issubclass(value, sympy.Basic) and value.__module__ == functions.__name__
                     and name == value.__name__)

__all__ = ["ValueRanges", "bound_sympy", "int_oo", "is_channels_last_contiguous_or_false", "is_contiguous_or_false",
           "sympy_function_names"]
