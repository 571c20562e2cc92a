"""Artifacts across torch releases by their op schemas: the stored registries of 2.11 to 2.15
(schemas/ops/registry@*.json) and the real schema differences between them; artifacts that releases
wrote calling the ops that differ (tests/golden/drift/torch-<release>/, written by
tools/make_drift_goldens.py) load on the running release, upgraded or downgraded; and
``export_model(..., target_torch=)`` writes another release's schemas, or refuses naming what that
release cannot express."""

from __future__ import annotations

import copy
import json
import pathlib
import re
import warnings

import pytest
import torch

from tests.support.drift_cases import NAMES, NOT_ON_CPU, CholeskyQr, SdpaMathForMps, cases
from exporter import export_model, load
from exporter.errors import SchemaDriftError, TargetTorchError
from exporter.serialize import reader
from exporter.versioning import registries, schema_drift
from tests.support.golden_io import assert_close_to_stored, load_io, torchs_own_result
from tests.support.helpers import assert_bitwise, assert_close_to_eager

ROOT = pathlib.Path(__file__).resolve().parents[2]
DRIFT = ROOT / "tests" / "golden" / "drift"
WRITERS = sorted((p for p in DRIFT.iterdir() if p.is_dir()),
                 key=lambda p: tuple(int(x) for x in p.name[len("torch-"):].split(".")))
READER = torch.__version__.split("+")[0]
CASES = [(d.name[len("torch-"):], n) for d in WRITERS for n in json.loads((d / "manifest.json").read_text())["cases"]]

# every schema that differs between neighbouring stored releases (ops present in both), as compared
# by schema_drift.compare; removed and added ops are in REMOVED / the registries
DIFFERENCES = {
    ("2.11", "2.12"): {"aten::_flash_attention_forward.default": "compatible",
                       "aten::_scaled_dot_product_attention_math_for_mps.default": "compatible"},
    ("2.12", "2.13"): {},
    ("2.13", "2.14"): {"aten::_cdist_backward.default": "breaking", "aten::_cdist_backward.out": "breaking",
                       "aten::_pdist_backward.default": "breaking", "aten::_pdist_backward.out": "breaking",
                       "aten::_cudnn_attention_forward.default": "compatible"},
    ("2.14", "2.15"): {},
}
REMOVED_IN_2_14 = {"aten::cholesky.default", "aten::cholesky.out", "aten::qr.default", "aten::qr.Q"}

# what the tests that capture programs here need of the running release (they run on every release
# of the matrix; the ones that need a newer op or argument skip on older ones)
HERE = registries.running_registry()
_MPS = HERE["ops"].get("aten::_scaled_dot_product_attention_math_for_mps.default", "")
needs_gqa = pytest.mark.skipif("enable_gqa" not in _MPS, reason="this torch's MPS attention op has no enable_gqa (2.12+)")
needs_lanczos = pytest.mark.skipif("aten::_upsample_lanczos2d_aa.default" not in HERE["ops"],
                                   reason="this torch has no _upsample_lanczos2d_aa (2.12+)")
needs_uint64 = pytest.mark.skipif("UINT64" not in HERE["scalar_types"], reason="this torch cannot serialize uint64")
needs_qr = pytest.mark.skipif("aten::qr.default" not in HERE["ops"], reason="torch.qr was removed in 2.14")


def _pairs():
    rel = registries.stored_releases()
    return list(zip(rel, rel[1:]))


def test_the_stored_registries_are_the_supported_releases_and_this_ones_is_current():
    import subprocess
    import sys

    assert registries.stored_releases() == ["2.11", "2.12", "2.13", "2.14", "2.15"]
    assert registries.load(READER).torch_version == READER
    # in a fresh process, as it was written (imported modules such as torch._inductor register more ops)
    done = subprocess.run([sys.executable, "-m", "tools.op_registry", "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"regenerate schemas/ops/registry@{registries.release_key(READER)}.json: {done.stdout}"


def test_schema_differences_between_neighbouring_releases_are_the_listed_ones():
    found = {}
    for a, b in _pairs():
        ra, rb = registries.load(a), registries.load(b)
        found[(a, b)] = {k: schema_drift.compare(schema_drift.parse(ra.ops[k]), schema_drift.parse(rb.ops[k])).kind
                         for k in sorted(set(ra.ops) & set(rb.ops)) if ra.ops[k] != rb.ops[k]}
        found[(a, b)] = {k: v for k, v in found[(a, b)].items() if v != "identical"}
    assert found == DIFFERENCES
    assert REMOVED_IN_2_14 <= set(registries.load("2.13").ops) - set(registries.load("2.14").ops)
    text = (ROOT / "docs" / "releases.md").read_text()
    for diffs in DIFFERENCES.values():
        for op in diffs:
            assert op.rsplit(".", 1)[0] in text, f"docs/releases.md does not list {op}"


@pytest.mark.parametrize("op", ["aten::_cdist_backward", "aten::_pdist_backward"])
def test_each_breaking_change_has_an_upgrader_and_a_downgrader(op):
    old, new = registries.load("2.13").schema(op, "default"), registries.load("2.14").schema(op, "default")
    up = schema_drift.find_upgrader(op, "default", schema_drift.parse(old))
    down = schema_drift.find_upgrader(op, "default", schema_drift.parse(new))
    assert schema_drift.same_schema(schema_drift.parse(up.new_schema), schema_drift.parse(new))
    assert schema_drift.same_schema(schema_drift.parse(down.new_schema), schema_drift.parse(old))


@pytest.mark.parametrize("op, into", [("aten::cholesky", "aten::linalg_cholesky"), ("aten::qr", "aten::linalg_qr")])
def test_each_op_removed_in_2_14_has_an_upgrader_to_an_op_2_14_has(op, into):
    up = schema_drift.find_upgrader(op, "default", schema_drift.parse(registries.load("2.13").schema(op, "default")))
    target = schema_drift.parse(up.new_schema)
    assert target.name == into
    assert schema_drift.same_schema(target, schema_drift.parse(registries.load("2.14").schema(into, "default")))


def test_drift_golden_folders_are_complete():
    assert [d.name for d in WRITERS] == [f"torch-{v}" for v in ("2.11.0", "2.12.1", "2.13.0", "2.14.1", "2.15.0")]
    for d in WRITERS:
        m = json.loads((d / "manifest.json").read_text())
        assert sorted(p.stem for p in d.glob("*.pt2b")) == sorted(m["cases"])
        has_qr = registries.load(m["release"]).schema("aten::qr", "default") is not None
        assert set(m["cases"]) == set(NAMES) - (set() if has_qr else {"cholesky_qr"})


@pytest.mark.parametrize("writer,name", CASES, ids=[f"{w}/{n}" for w, n in CASES])
def test_drift_golden_loads_here_with_its_schemas_reconciled(writer, name):
    """Every op whose recorded schema is not this release's is reconciled (a note names how), the
    program calls this release's ops, and it computes what it computed on its writer's release."""
    path = DRIFT / f"torch-{writer}" / f"{name}.pt2b"
    recorded = {(q, o): s for q, o, s, _ in reader.operator_records(reader.open_artifact(path))}
    prog = load(path)
    assert prog.torch_version.split("+")[0] == writer
    here = registries.load(READER)
    for (q, o), schema in recorded.items():
        if not q.startswith("aten::"):
            continue
        note = prog.provenance.get(f"upgraded_op:{q}.{o}")
        assert (note is not None) == (schema != here.schema(q, o)), (q, o, note)
    for node in prog.exported_program().graph.nodes:
        if isinstance(node.target, torch._ops.OpOverload):
            assert {k for k in node.kwargs} <= {a.name for a in node.target._schema.arguments}
    if name in NOT_ON_CPU:
        return
    (args, kwargs), expected = load_io(path.with_suffix(".io.npz"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = prog(*copy.deepcopy(args))
    if writer == READER:  # bits: against torch's own loader on this machine (stored outputs are another's)
        assert_close_to_eager(got, torchs_own_result(load(path), args, {}), rtol=0, atol=0)
    assert_close_to_stored(got, expected)


def _record(path, op):
    return next(s for q, o, s, _ in reader.operator_records(reader.open_artifact(path)) if f"{q}.{o}" == op)


@needs_gqa
def test_target_an_older_release_drops_arguments_it_lacks_where_they_hold_their_defaults(tmp_path):
    model, args = cases()["sdpa_math_for_mps"]
    path = tmp_path / "m.pt2b"
    export_model(model, args, path, target_torch="2.11")
    op = "aten::_scaled_dot_product_attention_math_for_mps.default"
    assert _record(path, op) == registries.load("2.11").ops[op]
    prog = load(path)
    assert prog.provenance["target_torch"] == "2.11.0"
    assert "enable_gqa=False dropped" in prog.provenance[f"retargeted_op:{op}"]
    assert "added keyword argument enable_gqa=False" in prog.provenance[f"upgraded_op:{op}"]  # read back here


@needs_gqa
def test_target_refuses_an_argument_the_release_lacks_naming_it(tmp_path):
    _, args = cases()["sdpa_math_for_mps"]
    path = tmp_path / "m.pt2b"
    with pytest.raises(TargetTorchError) as e:
        export_model(SdpaMathForMps(enable_gqa=True), args, path, target_torch="2.11")
    msg = str(e.value)
    assert "aten::_scaled_dot_product_attention_math_for_mps.default" in msg and "enable_gqa=True" in msg
    assert "torch 2.11.0 has no argument 'enable_gqa'" in msg and f"torch {READER}" in msg
    assert not path.exists()


@needs_lanczos
def test_target_refuses_an_op_the_release_lacks_naming_it(tmp_path):
    class Lanczos(torch.nn.Module):  # F.interpolate(mode="lanczos") calls it; new in torch 2.12
        def forward(self, x):
            return torch.ops.aten._upsample_lanczos2d_aa(x, [4, 4], False)

    path = tmp_path / "m.pt2b"
    with pytest.raises(TargetTorchError, match=r"aten::_upsample_lanczos2d_aa\.default.*torch 2\.11\.0 has no op "
                                               r"aten::_upsample_lanczos2d_aa") as e:
        export_model(Lanczos(), (torch.randn(1, 3, 8, 8),), path, target_torch="2.11")
    assert "target a later release" in str(e.value).lower() and not path.exists()
    export_model(Lanczos(), (torch.randn(1, 3, 8, 8),), path, target_torch="2.12")  # 2.12 has it
    assert load(path).provenance["target_torch"] == "2.12.1"


@needs_uint64
def test_target_refuses_a_dtype_the_releases_export_schema_lacks(tmp_path):
    class Flash(torch.nn.Module):  # its rng_state output is uint64, which 2.11's export schema cannot name
        def forward(self, q, k, v):
            return torch.ops.aten._flash_attention_forward(q, k, v, None, None, 4, 4, 0.0, False, False)[0]

    q = torch.randn(1, 4, 2, 8)
    with pytest.raises(TargetTorchError, match=r"torch 2\.11\.0's export schema has no dtype UINT64, which the "
                                               r"program's values use \(UINT64: getitem"):
        export_model(Flash(), (q, q, q), tmp_path / "m.pt2b", target_torch="2.11")


def test_target_across_2_14_renames_arguments(tmp_path):
    model, args = cases()["cdist_pdist_backward"]
    path = tmp_path / "c.pt2b"
    release = "2.13" if "grad_output" in HERE["ops"]["aten::_cdist_backward.default"] else "2.14"  # the other side
    export_model(model, args, path, target_torch=release)
    target = registries.load(release)
    for op in ("aten::_cdist_backward.default", "aten::_pdist_backward.default"):
        assert _record(path, op) == target.ops[op]
    assert_bitwise(load(path)(*args), model(*args))

@needs_qr
def test_target_a_newer_release_rewrites_the_ops_it_removed(tmp_path):
    a = torch.randn(4, 4, generator=torch.Generator().manual_seed(1))
    path = tmp_path / "q.pt2b"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        export_model(CholeskyQr(), (a,), path, target_torch="2.14")
        prog = load(path)
        assert not {"aten::cholesky.default", "aten::qr.default"} & set(prog.ops())
        assert {"aten::linalg_cholesky.default", "aten::linalg_qr.default"} <= set(prog.ops())
        assert_close_to_eager(prog(a), CholeskyQr()(a), rtol=1e-6, atol=1e-6)
    assert "linalg_cholesky(A, upper=upper)" in prog.provenance["retargeted_op:aten::cholesky.default"]


@pytest.mark.parametrize("target, why", [("2.9", "pt2b has no operator registry of torch 2.9 (it has: 2.11, 2.12, "
                                                "2.13, 2.14, 2.15)"),
                                         ("latest", "'latest' is not a torch release")])
def test_target_an_unknown_release_is_refused(tmp_path, target, why):
    model, args = cases()["cdist_pdist_backward"]
    with pytest.raises(TargetTorchError, match=re.escape(why)):
        export_model(model, args, tmp_path / "m.pt2b", target_torch=target)


def _against(path, release):
    art = reader.open_artifact(path)
    side = schema_drift.Side(registries.load(release))
    return schema_drift.reconcile(reader.decode_graph(art), reader.operator_records(art), str(path), side)


@needs_gqa
def test_a_newer_artifact_read_against_an_older_release_drops_defaults_or_names_the_argument(tmp_path):
    """What torch 2.11 does on load with an artifact of this release (the matrix runs it there for
    real: tests/golden/drift/torch-2.13.0 on 2.11): the argument 2.12 added is dropped at its
    default; holding anything else, the error names the node, the argument and both releases."""
    _, args = cases()["sdpa_math_for_mps"]
    default, other = tmp_path / "d.pt2b", tmp_path / "o.pt2b"
    export_model(SdpaMathForMps(), args, default)
    export_model(SdpaMathForMps(enable_gqa=True), args, other)
    serialized, notes, _ = _against(default, "2.11")
    assert notes == ["aten::_scaled_dot_product_attention_math_for_mps.default: compatible drift (argument "
                     "enable_gqa=False dropped where it holds its default) [1 node]"]
    node = next(n for n in serialized.graph_module.graph.nodes if "math_for_mps" in n.target)
    assert "enable_gqa" not in {i.name for i in node.inputs}
    with pytest.raises(SchemaDriftError, match=rf"passes enable_gqa=True, and torch 2\.11\.0 has no argument "
                                               rf"'enable_gqa' \(the artifact's torch {re.escape(READER)} has it"):
        _against(other, "2.11")
