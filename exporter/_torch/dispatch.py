"""torch's operators and dispatch modes: OpOverload and its kin (torch._ops), the dispatch-mode base
and stack (torch.utils._python_dispatch) and fake tensors (torch._subclasses.fake_tensor)."""

from torch._ops import HigherOrderOperator, OpOverload, OpOverloadPacket
from torch._ops import _get_dispatch_mode_pre_dispatch as get_dispatch_mode_pre_dispatch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._python_dispatch import _disable_current_modes as disable_current_modes
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

__all__ = ["FakeTensor", "FakeTensorMode", "HigherOrderOperator", "OpOverload", "OpOverloadPacket",
           "TorchDispatchMode", "disable_current_modes", "get_dispatch_mode_pre_dispatch", "is_traceable_wrapper_subclass",
           "unset_fake_temporarily"]
