"""pt2b: export a PyTorch model once at its highest level, lower it per backend after load.

Public API: export_model, load, load_for_backend, eager_decompositions, plus errors.
"""

from . import errors  # noqa: E402
from .api import export_model, load, load_for_backend  # noqa: E402
from .eager import eager_decompositions  # noqa: E402
from .program import Pt2bProgram  # noqa: E402
from .version import __version__  # noqa: E402

__all__ = ["__version__", "errors", "export_model", "load", "load_for_backend", "eager_decompositions", "Pt2bProgram"]
