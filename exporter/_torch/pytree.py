"""torch's pytree modules: torch.utils._pytree (flatten, specs, registration) and torch.fx._pytree
(flattening by a spec, as torch.export's calling convention does)."""

import torch.fx._pytree as fx_pytree
import torch.utils._pytree as pytree

__all__ = ["fx_pytree", "pytree"]
