"""Generated FlatBuffers code matches schemas/pt2b.fbs, and the schema mirrors every field of
torch.export's serialization dataclasses (so nothing of a program is silently dropped)."""

import dataclasses

import pytest

from exporter.serialize.mapping import schema_map
from tools import regen_flatbuffers as regen
from exporter.layout.generated import pt2b_generated as G
from torch._export.serde import schema as S


def _schema_dataclasses() -> list[type]:
    """Every dataclass of torch's export schema that a .pt2b program can contain."""
    seen: dict[type, None] = {}

    def visit(desc):
        if desc[0] == "dc" and desc[1] not in seen:
            seen[desc[1]] = None
            for _, _, d, _ in schema_map.fields(desc[1]):
                visit(d)
        elif desc[0] in ("list", "opt", "dict", "listlist"):
            visit(desc[1])

    visit(("dc", S.ExportedProgram))
    return list(seen)


def test_generated_code_is_reproducible():
    try:
        fresh = regen.generate()
    except FileNotFoundError as e:
        pytest.fail(str(e))
    assert regen.GENERATED.read_text() == fresh, "run `python -m tools.regen_flatbuffers` and commit"


def test_schema_mirrors_every_torch_serde_field():
    classes = _schema_dataclasses()
    assert len(classes) >= 40
    for cls in classes:
        table = getattr(G, cls.__name__ + "T", None)
        assert table is not None, f"schemas/pt2b.fbs has no table {cls.__name__}"
        inst = table()
        for f in dataclasses.fields(cls):
            attr = schema_map.camel(f.name)
            assert hasattr(inst, attr), f"table {cls.__name__} lacks field {f.name}"
