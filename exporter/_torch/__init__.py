"""The one door to torch's private internals: every private torch module that more than one module of
pt2b needs, torch.export's serializer (``torch._export.serde``), what differs between the supported torch
releases, and every patch pt2b makes to a torch object, each declared in one list.

- ``serde``: torch.export's schema dataclasses and their union base (cheap: no torch._dynamo);
- ``serializer``: torch.export's serializer and deserializer (imports torch._dynamo: import it where it is used);
- ``pytree``, ``dispatch``, ``tracing``, ``symbolic``: pytrees; operators and modes; decomposition tables,
  torch.export's helpers and higher-order ops; sympy numbers and value ranges;
- ``compat``: the release probes ([releases.md](../../docs/releases.md));
- ``patches``: the inventory of patches (symbol, scope, reason, releases verified) and the helpers that
  install them;
- ``testing``: torch's OpInfo database, for the audit only.

Nothing here is imported by ``import exporter`` (tests/repo/test_import_graph.py).
"""
