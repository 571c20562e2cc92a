"""torch's operators and dispatch modes: OpOverload and its kin (torch._ops), the dispatch-mode base
and stack (torch.utils._python_dispatch) and fake tensors (torch._subclasses.fake_tensor, torch._guards)."""

from torch._dispatch.python import enable_python_dispatcher
from torch._guards import detect_fake_mode
from torch._ops import HigherOrderOperator, OpOverload, OpOverloadPacket
from torch._ops import _get_dispatch_mode_pre_dispatch as get_dispatch_mode_pre_dispatch
from torch._subclasses.fake_tensor import (FakeTensor, FakeTensorMode, disable_fake_tensor_cache,
                                           unset_fake_temporarily)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._python_dispatch import _disable_current_modes as disable_current_modes
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

__all__ = ["FakeTensor", "FakeTensorMode", "HigherOrderOperator", "OpOverload", "OpOverloadPacket",
           "TorchDispatchMode", "detect_fake_mode", "disable_current_modes", "disable_fake_tensor_cache",
           "drop_cached_dispatches", "enable_python_dispatcher", "get_dispatch_mode_pre_dispatch",
           "is_traceable_wrapper_subclass", "unset_fake_temporarily"]


def drop_cached_dispatches(fake_mode) -> None:
    """Forget the results fake tensors cached on ``fake_mode``'s ShapeEnv (``fake_tensor_cache``, where
    torch keeps the outputs of ops on symbolic shapes). Their keys do not hold the symbolic-shape config
    they were computed under: a consumer retracing under ``backed_size_oblivious=True`` (torch.onnx)
    would reuse a size computed without it (a mamba2 slice of size ``Max(0, L - Max(0, L - 1))``, which
    then fails to broadcast against ``L``). Releases without the cache have nothing to drop."""
    cache = getattr(getattr(fake_mode, "shape_env", None), "fake_tensor_cache", None)
    if cache is not None:
        cache.clear()
