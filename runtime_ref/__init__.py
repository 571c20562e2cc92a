"""pt2b's reference runtime: executes lowered (functional) torch.export programs on cpu or cuda.
Public API: Runtime, runtimes (every method of a multi-method artifact over one state), default_opset_accepts, op_name; the correctness oracle backends compare against."""

from .opset import default_opset_accepts, op_name
from .runtime import Runtime, runtimes

__all__ = ["Runtime", "default_opset_accepts", "op_name", "runtimes"]
