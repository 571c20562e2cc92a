"""Issue 39: values .pt2b cannot store are refused before anything is written, with an
UnsupportedValueError that names the value and what to do; never a raw error from deep in the writer."""

from __future__ import annotations

import pytest
import torch
from torch.testing._internal.two_tensor import TwoTensor

from exporter import export_model
from exporter.errors import ExportError, UnsupportedValueError


def _subclass_weight_model():
    m = torch.nn.Linear(4, 3)
    w = m.weight.detach()
    m.weight = torch.nn.Parameter(TwoTensor(w.clone(), w.clone()), requires_grad=False)
    return m


def test_a_tensor_subclass_weight_is_refused_by_name_with_the_remedy(tmp_path):
    """torchao's quantized weights are tensor subclasses: the writer crashed with "Attempted to access the
    data pointer on an invalid python storage" (a RuntimeError from the weights plan)."""
    m, x = _subclass_weight_model(), torch.randn(2, 4)
    assert isinstance(torch.export.export(m, (x,)).state_dict["weight"], TwoTensor)  # torch.export takes it
    path = tmp_path / "m.pt2b"
    with pytest.raises(UnsupportedValueError, match=r"'weight' is a tensor subclass, torch\.testing\._internal\."
                                                    r"two_tensor\.TwoTensor \(it wraps the tensors a, b\): .pt2b stores "
                                                    r"plain tensors.* torchao\.utils\.unwrap_tensor_subclass\(model\)"):
        export_model(m, (x,), path)
    assert not path.exists() and not list(tmp_path.iterdir())
    assert issubclass(UnsupportedValueError, ExportError)

