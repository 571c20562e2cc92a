"""Every error pt2b raises on purpose, in one hierarchy.

Each message says what is wrong, where (file, section, node, op) and what to do about it.
"""

from __future__ import annotations

from .util.visible import escape


class Pt2bError(Exception):
    """Base class of all pt2b errors. A message may quote a file's strings, and a traceback prints it to
    a terminal: every control character in it but newline and tab is shown as its escape."""

    def __init__(self, *args):
        super().__init__(*(escape(a, layout=True) if isinstance(a, str) else a for a in args))


# ---- export side ----
class ExportError(Pt2bError):
    """A model, its inputs or the destination cannot be exported/written."""


class UnsupportedValueError(ExportError):
    """The program holds a value the .pt2b format cannot store (e.g. a torchbind object)."""


class TargetTorchError(ExportError):
    """``export_model(..., target_torch=)``: the program calls ops, arguments or dtypes that the
    target torch release does not have (the message names each), or pt2b has no registry of it."""


# ---- reading artifacts ----
class ArtifactError(Pt2bError):
    """A .pt2b file cannot be read. Subclasses say why."""


class NotAnArtifactError(ArtifactError):
    """The file is not a .pt2b artifact at all (wrong magic, empty, a directory...)."""


class CorruptArtifactError(ArtifactError):
    """The file is a .pt2b artifact but its bytes are damaged or inconsistent."""


class UnsupportedVersionError(ArtifactError):
    """The artifact's format version cannot be read by this pt2b."""


class PickledContentError(ArtifactError):
    """A torch.export.save archive (.pt2) holds content that reading it would unpickle, which can run any
    code: `pt2b convert` names each such entry and reads it only with --trust-pickle."""


class MethodNotFoundError(ArtifactError, KeyError):
    """The artifact holds no method of the name asked for (``prog["decode"]``, ``method="decode"``,
    ``--method``); the message lists the methods it holds. Also a KeyError, as for a mapping."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class MissingOperatorError(ArtifactError):
    """The artifact calls operators that the running torch does not have registered."""


class SchemaDriftError(MissingOperatorError):
    """The artifact's op schemas differ from the running torch's in ways no upgrader covers.

    A MissingOperatorError (the op *as recorded* is not available); the message lists every
    such op with both schemas."""


# ---- lowering and running ----
class MissingPytreeTypeError(ArtifactError):
    """The program's inputs or outputs are a Python type (a dataclass, a model's output class) that no
    imported module registers with torch's pytree: import the library that defines it first."""


class MissingTensorSubclassError(ArtifactError):
    """The artifact holds a tensor-subclass weight whose class name no
    exporter.register_tensor_subclass call of this process registered: register the class first."""


class LoweringError(Pt2bError):
    """A program cannot be lowered to what the backend asked for."""


class OpsetError(LoweringError):
    """A program holds operators outside the set a backend or runtime accepts; lists all of them."""


class BackendUnavailableError(LoweringError):
    """A backend pt2b does not know, or one that is not installed (the message names what to pip install)."""


class BackendHandOffError(Pt2bError):
    """A backend refused or failed to take a lowered program (the message names the backend and its
    own error, which is chained)."""


class BackendResultError(Pt2bError):
    """A backend's compiled program computes other outputs than the lowered program it was given, on the
    artifact's stored example inputs, as to_backend compares them: names the output and the difference."""


class BackendStateError(BackendHandOffError):
    """A program that writes its buffers (a KV cache, running statistics, a counter) handed to a backend
    that would hold them as constants, running every call from their exported values."""


class BackendRunError(Pt2bError):
    """A backend's compiled program was called with inputs that do not match, or did not return what
    the program returns."""


class RuntimeInputError(Pt2bError):
    """Inputs given to a loaded program do not match its recorded signature."""


class InputGuardError(RuntimeInputError, AssertionError):
    """Inputs that break a condition on input sizes the program was exported with (a static size, or a
    derived dim's relation: ``x.size(0) == y.size(0) + 1``). An AssertionError too, as torch's own
    module raises for it, with torch's text of the condition."""


class MissingKernelError(Pt2bError, NotImplementedError):
    """A loaded program calls an op the running torch has no kernel of for the inputs' device (an op
    captured where torch chose a device's own kernel, as MPS's attention): names each op and the devices
    that have one. A NotImplementedError too, as torch's dispatcher raises for it."""


class LibraryTableWarning(UserWarning):
    """A library's private table or function that a backend's hand-off uses where it is installed
    (transformers' ONNX Runtime fusions) failed on this program or this version of the library: the
    hand-off goes on without it, as it does where the library is missing, and says what it did instead."""


class UnknownOpsWarning(UserWarning):
    """A backend's supported_ops list names ops the running torch does not have (TorchScript-only
    overloads such as aten::add.int, ops of another torch release): they are left out of the lowering
    (LoweredProgram.unknown_supported_ops lists them); ``warnings.simplefilter("error", UnknownOpsWarning)``
    makes them an error."""


__all__ = [
    "Pt2bError",
    "ExportError",
    "UnsupportedValueError",
    "ArtifactError",
    "NotAnArtifactError",
    "CorruptArtifactError",
    "UnsupportedVersionError",
    "PickledContentError",
    "MethodNotFoundError",
    "MissingOperatorError",
    "SchemaDriftError",
    "LoweringError",
    "OpsetError",
    "BackendUnavailableError",
    "BackendHandOffError",
    "LibraryTableWarning",
    "BackendRunError",
    "BackendResultError",
    "BackendStateError",
    "RuntimeInputError",
    "InputGuardError",
    "MissingKernelError",
    "UnknownOpsWarning",
    "InstallationError",
    "TargetTorchError",
    "MissingPytreeTypeError",
    "DeprecatedSpellingWarning",
    "SweepError",
]


class InstallationError(Pt2bError):
    """One of pt2b's own files (its schema, a frozen preset, an op registry) is missing or corrupt:
    the installation is broken, not the user's input."""


class SweepError(Pt2bError):
    """A sweep (exporter.sweep) cannot run as asked: a case's function that is not importable by name, a
    records file of another sweep, an interpreter or a Ray cluster that is not there."""


class DeprecatedSpellingWarning(FutureWarning):
    """An argument spelt the way an earlier pt2b release spelt it (``preset="onnx"`` for
    ``backend="onnx"``, ``strict=True`` for ``lossless=True`` in load_for_backend): it still works for
    one release, and the warning names the new spelling."""
