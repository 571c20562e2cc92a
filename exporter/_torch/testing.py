"""torch's OpInfo database (torch.testing._internal.common_methods_invocations.op_db): the samples
`pt2b opset audit` runs each decomposition on (exporter/explorer/audit.py). It is torch's test-only code:
imported when the audit runs, never before, and a torch that cannot import it is a LoweringError."""

from __future__ import annotations

from ..errors import LoweringError


def op_db() -> list:
    """torch's OpInfo entries; a LoweringError saying why where this torch cannot import them."""
    try:
        from torch.testing._internal.common_methods_invocations import op_db as entries
    except ImportError as e:
        import torch

        raise LoweringError(
            f"the decomposition audit runs torch's OpInfo samples (torch.testing._internal."
            f"common_methods_invocations), which this torch ({torch.__version__}) cannot import: "
            f"{type(e).__name__}: {e}. Run the audit with a full torch install (it ships torch.testing and "
            f"its test dependencies, such as expecttest).") from e
    return entries
