"""torch.library's own registries of the Python functions behind custom ops (torch._library.custom_ops'
OPDEFS, torch._library.simple_registry's singleton): pt2b reads them, never writes them."""

from torch._library.custom_ops import OPDEFS
from torch._library.simple_registry import singleton as SIMPLE_REGISTRY

__all__ = ["OPDEFS", "SIMPLE_REGISTRY"]
