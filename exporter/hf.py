"""Export that knows transformers models (`pt2b export --hf`): ``export_hf`` builds a model from a local folder,
config.json or model type and exports it for an optimum-cli task, with that task's inputs, dynamic sizes and methods."""

from __future__ import annotations

import os
import pathlib
import warnings
from typing import TYPE_CHECKING, Any

from .errors import ExportError

if TYPE_CHECKING:
    from .program import Pt2bProgram

__all__ = ["TASKS", "export_hf", "check_request", "supported_tasks", "methods_for", "static_cache_decoder"]

# Importing transformers (and torch) waits for the functions that build a model: the command line reads
# the task names and checks a request before either is imported, and pt2b never requires transformers.

# task (optimum-cli's name) -> (transformers' auto class that builds its model, the auto mapping of the
# model types that class builds)
TASKS = {
    "feature-extraction": ("AutoModel", "MODEL_MAPPING_NAMES"),
    "text-classification": ("AutoModelForSequenceClassification", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"),
    "fill-mask": ("AutoModelForMaskedLM", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),
    "image-classification": ("AutoModelForImageClassification", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"),
    "text-generation": ("AutoModelForCausalLM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    "text-generation-no-cache": ("AutoModelForCausalLM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    "text2text-generation": ("AutoModelForSeq2SeqLM", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),
}
CACHED = "text-generation"  # the task exported as prefill and decode over a static KV cache
MAX_CACHE_LEN = 256  # the default cache length (capped at the model's max_position_embeddings)
SOURCES = ("a model folder (config.json, weights in *.safetensors), a config.json, or a model type such as "
           "llama or bert")


def check_request(source: str | os.PathLike[str], task: str) -> None:
    """The checks that need neither torch nor transformers: the task is one pt2b knows, and a source
    that names a path names one that exists (a folder with its config.json)."""
    if task not in TASKS:
        from .util.closest import did_you_mean

        raise ExportError(f"unknown task {task!r};{did_you_mean(task, TASKS)} pt2b exports transformers models "
                          f"for {', '.join(TASKS)}.")
    _where(source)


def _where(source) -> tuple[str, pathlib.Path | None]:
    """("folder" | "file" | "type", the path): what ``source`` names, refused where a path is missing."""
    path = pathlib.Path(source)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ExportError(f"{str(source)!r} is a folder without config.json; --hf takes {SOURCES}.")
        return "folder", path
    if path.is_file():
        return "file", path
    text = os.fspath(source)
    if os.sep in text or "/" in text or text.endswith(".json") or not text:
        raise ExportError(f"{text!r} does not exist; --hf takes {SOURCES} (nothing is downloaded).")
    return "type", None


def _config(source, overrides: dict[str, Any]):
    """transformers' config of ``source`` with ``overrides`` applied, and the folder holding its
    weights (None: there are none)."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    kind, path = _where(source)
    if kind == "type":
        if source not in CONFIG_MAPPING_NAMES:
            from .util.closest import did_you_mean

            raise ExportError(f"{source!r} is no folder, file or model type transformers "
                              f"{transformers.__version__} knows;{did_you_mean(source, CONFIG_MAPPING_NAMES)} "
                              f"--hf takes {SOURCES} (nothing is downloaded).")
        return transformers.AutoConfig.for_model(source, **overrides), None
    try:
        config = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True, **overrides)
    except (OSError, ValueError, KeyError) as e:
        raise ExportError(f"transformers cannot read the config of {str(source)!r}: {e}") from e
    weights = path if kind == "folder" and any(path.glob("*.safetensors")) else None
    return config, weights


def supported_tasks(model_type: str) -> list[str]:
    """The tasks of TASKS whose auto class builds a model for ``model_type`` (transformers' auto mappings)."""
    from transformers.models.auto import modeling_auto

    return [task for task, (_, mapping) in TASKS.items() if model_type in getattr(modeling_auto, mapping)]


def _build(config, weights, task: str, dtype, seed: int, source):
    """The task's model, eval mode: loaded from ``weights``, else initialized from ``seed``."""
    import torch
    import transformers

    if task not in supported_tasks(config.model_type):
        auto_class = TASKS[task][0]
        raise ExportError(f"transformers has no {task} model for model type {config.model_type!r} ({auto_class} "
                          f"builds none); pt2b exports it for: {', '.join(supported_tasks(config.model_type)) or 'no task'}.")
    if hasattr(config, "use_cache"):  # a cache object in the outputs cannot be captured: only the cached task has one
        config.use_cache = task == CACHED
    auto = getattr(transformers, TASKS[task][0])
    given = {} if dtype is None else {"dtype": dtype}
    if weights is not None:
        model = auto.from_pretrained(str(weights), config=config, local_files_only=True, **given)
    else:
        warnings.warn(f"{os.fspath(source)} holds no weights (no *.safetensors): the model's weights are random, "
                      f"{TASKS[task][0]}.from_config after torch.manual_seed({seed}).", UserWarning, stacklevel=3)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = auto.from_config(config, **given)
    return model.eval()


def static_cache_decoder(model, batch_size: int = 1, max_cache_len: int = MAX_CACHE_LEN):
    """``model`` (a causal LM) in transformers' static-cache export wrapper: ``forward(input_ids=,
    cache_position=)`` writes the KV cache it holds as buffers (key_cache_0, ...) and returns the logits.
    It is captured with torch.export's strict mode: non-strict capture lifts the cache as constants."""
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    model.config.use_cache = True
    model.generation_config.use_cache = True
    model.generation_config.cache_implementation = "static"
    return TorchExportableModuleForDecoderOnlyLM(model, batch_size=batch_size, max_cache_len=max_cache_len).model.eval()


def _dim(name: str, top: int | None = None):
    import torch

    return torch.export.Dim(name, min=1, **({} if top is None else {"max": top}))


def _inputs(model, config, batch: int, seq: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Example inputs of a one-method task by the model's main input, with dynamic batch (and sequence)."""
    import inspect

    import torch

    name = model.main_input_name
    params = inspect.signature(model.forward).parameters
    if name == "input_ids":
        ids = torch.randint(0, config.get_text_config().vocab_size, (batch, seq),
                            generator=torch.Generator().manual_seed(0))
        dims = {0: _dim("batch"), 1: _dim("sequence", getattr(config, "max_position_embeddings", None))}
        kwargs = {"input_ids": ids}
        if "attention_mask" in params:
            kwargs["attention_mask"] = torch.ones_like(ids)
        return kwargs, {k: dims for k in kwargs}
    if name == "pixel_values":
        size = getattr(config, "image_size", 224)
        h, w = (size, size) if isinstance(size, int) else tuple(size)[-2:]
        pixels = torch.randn(batch, getattr(config, "num_channels", 3), h, w, generator=torch.Generator().manual_seed(0))
        return {"pixel_values": pixels}, {"pixel_values": {0: _dim("batch")}}
    raise ExportError(f"{type(model).__name__} takes {name!r} first; --hf exports models whose main input is "
                      f"input_ids or pixel_values. Export this one with export_model and your own example inputs.")


def methods_for(model, config, task: str, *, batch: int | None = None, seq: int | None = None,
                max_cache_len: int | None = None) -> tuple[dict[str, tuple], dict[str, Any], bool]:
    """(methods, dynamic_shapes by method, capture with torch.export's strict mode) of ``model`` for ``task``,
    in export_model's multi-method form."""
    import torch

    seq = 4 if seq is None else seq
    if task == CACHED:
        batch = 1 if batch is None else batch
        top = getattr(config.get_text_config(), "max_position_embeddings", None)
        length = max_cache_len or min(MAX_CACHE_LEN, top or MAX_CACHE_LEN)
        if not 2 <= seq < length:
            raise ExportError(f"seq={seq}: the prompt of the example must hold 2 or more tokens and fewer than "
                              f"max_cache_len={length}.")
        try:
            wrapper = static_cache_decoder(model, batch, length)
        except (ValueError, AssertionError, AttributeError) as e:
            raise ExportError(f"transformers' static-cache export wrapper refuses {type(model).__name__}: {e} "
                              "(--task text-generation-no-cache exports it without a cache).") from e
        prompt = torch.randint(0, config.get_text_config().vocab_size, (batch, seq),
                               generator=torch.Generator().manual_seed(0))
        sequence = _dim("sequence", length)
        methods = {"prefill": (wrapper, (), {"input_ids": prompt, "cache_position": torch.arange(seq)}),
                   "decode": (wrapper, (), {"input_ids": prompt[:, :1], "cache_position": torch.tensor([seq])})}
        return methods, {"prefill": {"input_ids": {1: sequence}, "cache_position": {0: sequence}}, "decode": None}, True
    batch = 2 if batch is None else batch
    if batch < 2 or seq < 2:
        raise ExportError(f"batch={batch}, seq={seq}: the example's sizes must be 2 or more, or torch.export "
                          "fixes them (a size of 1 is taken as static).")
    if task == "text2text-generation":
        from .hf_modules import Seq2Seq

        wrapper = Seq2Seq(model).eval()
        ids = torch.randint(0, config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            hidden = wrapper.encode(ids)
        dec = torch.zeros((batch, 3), dtype=torch.long)
        b, s, d = _dim("batch"), _dim("sequence"), _dim("decoder_sequence")
        methods = {"encode": (wrapper.encode, (ids,)), "decode": (wrapper.decode, (dec, hidden))}
        return methods, {"encode": ({0: b, 1: s},), "decode": ({0: b, 1: d}, {0: b, 1: s})}, False
    kwargs, dyn = _inputs(model, config, batch, seq)
    return {"forward": (model, (), kwargs)}, {"forward": dyn}, False


def export_hf(source: str | os.PathLike[str], task: str, path: str | os.PathLike[str], *, batch: int | None = None,
              seq: int | None = None, max_cache_len: int | None = None, dtype: Any = None, seed: int = 0,
              **config_overrides: Any) -> Pt2bProgram:
    """Build a transformers model and export it for ``task`` as optimum-cli's tasks are; returns the file loaded.

    ``source``: a model folder (its config.json; weights in ``*.safetensors`` are loaded with
    ``from_pretrained(local_files_only=True)``; without them the weights are random, from
    ``torch.manual_seed(seed)``, and a warning says so), a config.json, or a model type ("llama": its
    config's defaults). Nothing is downloaded. ``config_overrides`` set config fields
    (``num_hidden_layers=2``); ``dtype`` the weights' dtype (``torch.bfloat16``).

    ``task`` (one of TASKS): ``feature-extraction`` (AutoModel), ``text-classification``, ``fill-mask``
    and ``text-generation-no-cache`` (AutoModelForCausalLM without cache) take ``input_ids`` (and
    ``attention_mask``) with dynamic ``batch`` and ``sequence``; ``image-classification`` takes
    ``pixel_values`` of the config's image size with a dynamic ``batch``; these write one method.
    ``text-generation`` writes ``prefill`` (a prompt of dynamic ``sequence``, 1 to max_cache_len
    tokens) and ``decode`` (one token) over one static KV cache of ``max_cache_len`` positions (default
    256, capped at the model's max_position_embeddings) for ``batch`` sequences (default 1); both take
    ``input_ids`` and ``cache_position`` and return the logits. ``text2text-generation`` writes
    ``encode`` (``input_ids`` -> the encoder's hidden states) and ``decode`` (``decoder_input_ids``,
    the hidden states -> the next token's logits), dynamic ``batch``, ``sequence`` and
    ``decoder_sequence``. ``batch`` and ``seq`` are the example's sizes (2 or more where dynamic).
    A task the model type has no transformers class for is an ExportError naming the tasks it has.
    """
    check_request(source, task)
    from .api import export_model, load

    config, weights = _config(source, config_overrides)
    model = _build(config, weights, task, dtype, seed, source)
    methods, dynamic_shapes, dynamo = methods_for(model, config, task, batch=batch, seq=seq, max_cache_len=max_cache_len)
    metadata = {"transformers": {"task": task, "model_type": config.model_type, "class": type(model).__name__}}
    if len(methods) == 1:
        (fn, args, kwargs), = methods.values()
        export_model(fn, args, path, kwargs=kwargs, dynamic_shapes=dynamic_shapes["forward"], metadata=metadata)
    else:
        export_model(methods, path, dynamic_shapes=dynamic_shapes, metadata=metadata, strict=dynamo)
    return load(path)
