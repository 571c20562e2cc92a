"""pt2b's reference runtime: executes lowered (functional) torch.export programs on cpu or cuda, the
correctness oracle backends compare against. Public API: the names in ``__all__`` (docs/api.md)."""

from .opset import default_opset_accepts, op_name
from .runtime import Runtime, runtimes

__all__ = ["Runtime", "default_opset_accepts", "op_name", "runtimes"]
