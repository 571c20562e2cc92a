"""Programs that call ops whose schemas differ between torch releases 2.11 to 2.15 (found by comparing
the stored registries, schemas/ops/registry@*.json; docs/releases.md lists the differences). Used by
tools/make_drift_goldens.py, which writes them on each release, and tests/releases/test_target_torch.py."""

from __future__ import annotations

import torch


class CdistPdistBackward(torch.nn.Module):
    """_cdist_backward and _pdist_backward: input 'grad' renamed 'grad_output' in 2.14."""

    def forward(self, grad, x1, x2, pgrad, x):
        d = torch.cdist(x1, x2)
        p = torch.pdist(x)
        return (torch.ops.aten._cdist_backward(grad, x1, x2, 2.0, d),
                torch.ops.aten._pdist_backward(pgrad, x, 2.0, p))


class CholeskyQr(torch.nn.Module):
    """aten::cholesky and aten::qr: removed in 2.14 (linalg_cholesky and linalg_qr compute them)."""

    def forward(self, a):
        spd = a @ a.mT + torch.eye(a.shape[-1])
        q, r = torch.qr(a)
        q2, r2 = torch.qr(a, some=False)
        return torch.cholesky(spd), torch.cholesky(spd, upper=True), q, r, q2, r2


class SdpaMathForMps(torch.nn.Module):
    """_scaled_dot_product_attention_math_for_mps: keyword 'enable_gqa=False' added in 2.12."""

    def __init__(self, enable_gqa: bool = False):
        super().__init__()
        self.enable_gqa = enable_gqa

    def forward(self, q, k, v):
        return torch.ops.aten._scaled_dot_product_attention_math_for_mps(q, k, v, enable_gqa=self.enable_gqa)[0] \
            if self.enable_gqa else torch.ops.aten._scaled_dot_product_attention_math_for_mps(q, k, v)[0]


NAMES = ("cdist_pdist_backward", "cholesky_qr", "sdpa_math_for_mps")
# cases whose kernels do not run on CPU: their goldens are loaded and checked, not run
NOT_ON_CPU = {"sdpa_math_for_mps"}


def cases() -> dict:
    """name -> (module, args) of the NAMES the running torch can capture; inputs from a fixed seed."""
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    x1, x2 = r(3, 5), r(4, 5)
    x = r(6, 5)
    pgrad = r(15)
    q = r(1, 2, 4, 8)
    out = {
        "cdist_pdist_backward": (CdistPdistBackward(), (r(3, 4), x1, x2, pgrad, x)),
        "cholesky_qr": (CholeskyQr(), (r(4, 4),)),
        "sdpa_math_for_mps": (SdpaMathForMps(), (q, r(1, 2, 4, 8), r(1, 2, 4, 8))),
    }
    if not torch._C._jit_get_schemas_for_operator("aten::qr"):  # 2.14 removed it (torch.qr raises)
        del out["cholesky_qr"]
    return out
