"""The one door to torch's private internals: every private torch module or name pt2b imports (no
other module imports one), torch.export's serializer, the release probes and the declared patches
(docs/architecture.md#where-each-concept-lives; docs/releases.md). Nothing here is imported by
``import exporter`` (tests/repo/test_import_graph.py).

- ``serde``: torch.export's schema dataclasses (cheap: no torch._dynamo)
- ``serializer``: its serializer and deserializer (imports torch._dynamo: import where used)
- ``pytree``, ``dispatch``, ``tracing``, ``symbolic``: pytrees; operators and modes; tables, helpers, HOPs; sympy
- ``compat``: the release probes
- ``patches``: the inventory of patches and the helpers that install them
- ``testing``: torch's OpInfo database, for the audit only
- ``functorch``, ``compilers``, ``library``, ``unpickler``: aot_export and torch._functorch's pieces;
  Inductor's and torch.onnx's tables; torch.library's registries; the weights-only allowlist"""
