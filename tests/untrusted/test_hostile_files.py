"""Files built on purpose by an attacker (a valid FlatBuffer, correct checksums, structure chosen to
hurt): each gets a typed ArtifactError, runs nothing, writes nothing, with its work bounded by counting
it (files opened, the verifier's budget units, graphs decoded, guards checked, lines executed), never by
the clock. One test per attack, each rebuilt here from its description."""

import os
import pathlib
import subprocess
import sys

import pytest
import torch
from torch._export.serde import schema as S

from tests.support.artifact_surgery import rewrite_artifact, share_graph_across_methods
from exporter import export_model, load, load_for_backend
from exporter.cli import main as cli
from exporter.errors import ArtifactError, CorruptArtifactError, NotAnArtifactError
from exporter.serialize.read import buffer_bounds, decode_schema, integrity, untrusted
from tests.support.helpers import Mlp

OPENS = 3  # the most times one command opens the file it is given


def _exported(tmp_path, name="m.pt2b", model=None, args=None, **kw) -> pathlib.Path:
    path = tmp_path / name
    export_model(model or Mlp(), args or (torch.randn(2, 4),), path, **kw)
    return path


def _arg(**kw) -> S.NamedArgument:
    return S.NamedArgument(name="", arg=S.Argument.create(**kw), kind=S.ArgumentKind.POSITIONAL)


def _insert_call(graph, target: str, inputs: list) -> None:
    graph.nodes.insert(0, S.Node(target=target, inputs=inputs, outputs=[S.Argument.create(as_none=True)],
                                 metadata={}, is_hop_single_tensor_return=None, name="crafted"))


class Work:
    """The work a step does, counted (a loaded machine changes none of it): the files it opens and
    their program sections' sizes, the verifier's budget units it spends, the graphs it decodes, and
    (``spy``) the calls of any other function of interest."""

    def __init__(self, monkeypatch):
        self.sizes: list[int] = []
        self.decodes = 0
        self.calls: dict[str, list] = {}
        self._mp = monkeypatch
        opened = integrity.open_checked

        def open_checked(path, **kw):
            out = opened(path, **kw)
            self.sizes.append(out[1].program_size)
            return out

        def read(buf, pos, cls, *args, **kw):  # (recursive: a graph's decode starts at ExportedProgram)
            self.decodes += cls is S.ExportedProgram
            return decoded(buf, pos, cls, *args, **kw)

        decoded = decode_schema.read
        monkeypatch.setattr(integrity, "open_checked", open_checked)
        monkeypatch.setattr(decode_schema, "read", read)
        self._spent = buffer_bounds.SPENT

    def spy(self, module, name: str) -> list:
        """Record the first argument of every call of ``module.name`` (in calls[name])."""
        seen, real = self.calls.setdefault(name, []), getattr(module, name)

        def counted(*args, **kw):
            seen.append(args[0] if args else None)
            return real(*args, **kw)

        self._mp.setattr(module, name, counted)
        return seen

    @property
    def spent(self) -> int:
        return buffer_bounds.SPENT - self._spent

    def reset(self) -> None:
        self.sizes.clear()
        self.decodes = 0
        for seen in self.calls.values():
            seen.clear()
        self._spent = buffer_bounds.SPENT

    def assert_bounded(self, what, opens: int = OPENS) -> None:
        """At most ``opens`` opens of the file, the verifier's work within their program sections'
        bytes (one budget per open, however the file's tables are shared) and at most one graph decode
        per open: the step's checks cost a few times the file's size."""
        assert 1 <= len(self.sizes) <= opens, (what, self.sizes)
        assert 0 < self.spent <= sum(self.sizes), (what, self.spent, self.sizes)
        assert self.decodes <= len(self.sizes), (what, self.decodes, self.sizes)


@pytest.fixture()
def work(monkeypatch):
    return Work(monkeypatch)


def _every_command(path, work: Work, expected=ArtifactError, match=None):
    """load + check, first call, load_for_backend (uncached), pt2b verify/lower/run: each refuses with
    ``expected`` (the CLI with exit status 2); pt2b inspect, which summarizes the program table
    without checking the graph's meaning, refuses or summarizes. Each within Work.assert_bounded."""
    x = torch.randn(2, 4)
    steps = {
        "check": lambda: load(path).check(),
        "first call": lambda: load(path)(x),
        "load_for_backend": lambda: load_for_backend(path, cache=False),
    }
    for what, step in steps.items():
        work.reset()
        with pytest.raises(expected, match=match):
            step()
        work.assert_bounded(what)
    for argv in (["verify", str(path)], ["inspect", str(path)], ["lower", str(path), "--no-cache"],
                 ["run", str(path), "--no-cache"]):
        work.reset()
        assert cli(["--quiet", *argv]) in ((0, 2) if argv[0] == "inspect" else (2,)), argv
        work.assert_bounded(argv)


# ---- 1. code execution through a higher-order op's callable argument ----

@pytest.mark.parametrize("target, operator, payload", [
    # the attack: foreach_map(os.system, "<shell command>")
    ("torch.ops.higher_order.foreach_map", "torch.os.system", "touch {canary}"),
    # an allowlisted op that takes an operator, given a Python path: torch.save(obj, path) writes a file
    ("torch.ops.higher_order.with_effects", "torch.save", "{canary}"),
    ("torch.ops.higher_order.auto_functionalized", "builtins.eval", "open('{canary}', 'w')"),
    # an operator argument on an ordinary op
    ("torch.ops.aten.relu.default", "torch.ops.aten.relu.default", "x"),
])
def test_callable_arguments_never_resolve_python_paths(tmp_path, monkeypatch, work, target, operator, payload):
    monkeypatch.chdir(tmp_path)
    canary = tmp_path / "canary"
    path = _exported(tmp_path)

    def edit(serialized, program):
        _insert_call(serialized.graph_module.graph, target, [
            _arg(as_operator=operator), _arg(as_string=payload.format(canary=canary))])

    rewrite_artifact(path, path, edit=edit)
    before = set(os.listdir(tmp_path))
    _every_command(path, work, CorruptArtifactError)
    assert not canary.exists()
    assert set(os.listdir(tmp_path)) == before  # nothing written, no temp file left


def test_higher_order_op_allowlist():
    for name in untrusted.ALLOWED_HOPS:
        untrusted.check_target(f"torch.ops.higher_order.{name}", "t")
    for name in ("foreach_map", "flat_apply", "dynamo_bypassing_wrapper", "print", "invoke_leaf_function",
                 "inductor_compiled_code", "run_const_graph", "tag_activation_checkpoint"):
        with pytest.raises(CorruptArtifactError, match="higher-order op .* which pt2b does not accept"):
            untrusted.check_target(f"torch.ops.higher_order.{name}", "t")
    for value in ("torch.os.system", "torch.save", "_operator.attrgetter", "math.pow", "builtins.eval",
                  "torch.ops.higher_order.cond", "#custom:op", "torch.ops.aten.add"):
        with pytest.raises(CorruptArtifactError, match="not an operator registered"):
            untrusted.check_operator_argument(value, "t")
    untrusted.check_operator_argument("torch.ops.aten.add.Tensor", "t")


def test_source_fn_stack_is_resolved_only_through_the_allowlist(tmp_path):
    """Node metadata ``source_fn_stack`` names callables that torch resolves with getattr: pt2b's
    reader resolves them from torch.nn's classes, torch.nn.functional, torch's builtins and the
    operator registry, and leaves any other name as text (torch's own fallback)."""
    path = _exported(tmp_path)

    def edit(serialized, program):
        nodes = serialized.graph_module.graph.nodes
        nodes[0].metadata["source_fn_stack"] = "l1,torch.nn.modules.linear.Linear;f,torch.os.system"
        nodes[1].metadata["source_fn_stack"] = "r,torch.nn.functional.relu;a,torch.ops.aten.relu.default"

    rewrite_artifact(path, path, edit=edit)
    ep = load(path).exported_program()
    stacks = [n.meta["source_fn_stack"] for n in ep.graph.nodes if "source_fn_stack" in n.meta]
    assert stacks == [[("l1", torch.nn.Linear), ("f", "torch.os.system")],
                      [("r", torch.nn.functional.relu), ("a", torch.ops.aten.relu.default)]]


# ---- 2. quadratic work from tables shared across methods ----

class Chain(torch.nn.Module):
    def forward(self, x):
        for _ in range(300):
            x = x * 1.5 + 1.0
        return x


def test_methods_sharing_one_graph_table_are_refused_within_one_budget(tmp_path, work):
    """301 methods over one graph table: whatever walks the methods' graphs spends one budget, the
    program section's size, per open of the file; the second reference exhausts it."""
    src = _exported(tmp_path, "chain.pt2b", Chain(), (torch.randn(3),))
    path = share_graph_across_methods(src, tmp_path / "shared.pt2b", 300)
    assert path and os.path.getsize(path) < 2 * os.path.getsize(src) + 300 * 4096
    work.reset()
    prog = load(path)  # the root walk skips graphs: cheap
    assert len(prog.methods) == 301 and work.decodes == 0 and work.spent <= sum(work.sizes)
    x = torch.randn(3)
    every = lambda prog: [prog[m].check() for m in prog.methods]  # noqa: E731
    for what, step in {"check every method": lambda: every(load(path)),
                       "lower every method": lambda: load_for_backend(path, cache=False)}.items():
        work.reset()
        with pytest.raises(CorruptArtifactError, match="referenced more often than the buffer can hold"):
            step()
        work.assert_bounded(what)
        assert work.decodes <= 1, what  # the first reference only: 300 graphs' walks and decodes never ran
    assert torch.equal(load(path)(x), Chain()(x))  # the first reference alone is fine
    for argv in (["verify", str(path)], ["inspect", str(path)], ["upgrade", str(path), str(tmp_path / "u.pt2b")]):
        work.reset()
        assert cli(["--quiet", *argv]) == 2, argv
        work.assert_bounded(argv)
    assert not (tmp_path / "u.pt2b").exists()


# ---- 3. guard checks linear in their size ----

class Dyn(torch.nn.Module):
    def forward(self, x):
        return x * 2


def test_many_long_guards_are_checked_in_linear_time(tmp_path, work):
    """As many ~4 KB distinct guards as the cap allows: each checked once, the characters checked
    within the cap; one more guard: refused by every command before any is checked."""
    path = _exported(tmp_path, model=Dyn(), args=(torch.randn(4, 3),),
                     dynamic_shapes={"x": {0: torch.export.Dim("b", min=2, max=64)}})
    clause = "L['x'].size()[0] <= 64"
    guard = " and ".join([clause] * (untrusted.MAX_EXPR_LEN // (len(clause) + 5) - 1))  # ~4 KB, ~160 reads of L
    guards = [f"{guard} and L['x'].size()[0] <= {64 + i}" for i in range(1000)]  # distinct (repeats count once)
    assert all(len(g) <= untrusted.MAX_EXPR_LEN for g in guards)

    count = untrusted.MAX_GUARDS_TEXT // len(guards[-1])  # as many ~4 KB guards as fit: accepted
    assert count >= 10

    def edit(serialized, program):
        serialized.guards_code = guards[:count]

    rewrite_artifact(path, path, edit=edit)
    checked = work.spy(untrusted, "check_guard")
    work.reset()
    prog = load(path)
    prog.check()
    x = torch.randn(5, 3)
    assert torch.equal(prog(x), x * 2)
    assert checked == guards[:count]  # each once, in order, however often the program is used
    assert sum(map(len, checked)) <= untrusted.MAX_GUARDS_TEXT
    work.assert_bounded("load, check, call", opens=1)

    def more(serialized, program):  # one guard past the cap: refused before any guard is checked
        serialized.guards_code = guards[:count + 1]

    rewrite_artifact(path, path, edit=more)
    _every_command(path, work, CorruptArtifactError, "distinct guards of .* characters in all, more than 262144")
    assert checked == []


def test_a_guard_repeated_is_checked_and_compiled_once(tmp_path, work):
    """torch writes a guard once per use: a deeper olmo_hybrid repeats the same 470 guards (145 KB) more
    often (2,457 of them, 802 KB, at 8 layers). The writer stores each once; a file that repeats one
    (written by torch's own save, or by hand) is read with it once, however often it repeats."""
    x = torch.randn(4, 3)
    ep = torch.export.export(Dyn(), (x,), dynamic_shapes={"x": {0: torch.export.Dim("b", min=2, max=64)}})
    guards = [f"L['x'].size()[0] <= {64 + i % 3}" for i in range(30)]
    ep._guards_code = guards
    path = tmp_path / "repeats.pt2b"
    export_model(ep, path=path)
    assert load(path).exported_program()._guards_code == guards[:3]

    def repeat(serialized, program):  # far past the cap in all, one guard
        serialized.guards_code = [guards[0]] * (untrusted.MAX_GUARDS_TEXT // len(guards[0]) * 4)

    rewrite_artifact(path, path, edit=repeat)
    checked = work.spy(untrusted, "check_guard")
    prog = load(path)
    y = torch.randn(5, 3)
    assert torch.equal(prog(y), y * 2)
    assert prog.exported_program()._guards_code == guards[:1]  # what ep.module() compiles: one guard
    assert checked == guards[:1]
    with pytest.raises(AssertionError, match="Guard failed"):
        prog.exported_program().module()(torch.randn(65, 3))  # the guard still holds (torch's own module)


def test_a_program_with_as_many_guards_as_a_real_one_is_written_and_runs(tmp_path, work):
    """transformers' olmo_hybrid exports with 546 guards of 171 KB in all (its linear-attention chunking
    pads the sequence to a multiple of 64); pt2b refused to write it when all guards were capped at 64 KB.
    As many distinct guards of the same text, over this program's input: written, loaded, run; each
    guard checked once by the writer's check of what it wrote and once by the reader."""
    x = torch.randn(4, 3)
    ep = torch.export.export(Dyn(), (x,), dynamic_shapes={"x": {0: torch.export.Dim("b", min=2, max=64)}})
    s = "L['x'].size()[0]"
    padded = f"({s} + ((64 + (-1)*({s} % 64)) % 64))"
    guards = [f"max(1, {padded} // 64) <= {padded} + {i}" for i in range(546)]  # true for any size
    assert sum(map(len, guards)) > 64 * 1024
    ep._guards_code = guards
    path = tmp_path / "many_guards.pt2b"
    checked = work.spy(untrusted, "check_guard")
    export_model(ep, path=path)
    assert checked == guards
    prog = load(path)
    y = torch.randn(5, 3)
    assert torch.equal(prog(y), y * 2)
    assert prog.exported_program()._guards_code == guards
    assert checked == guards + guards


def _steps(fn) -> int:
    """The Python lines ``fn()`` executes and the C functions it calls: a count of its work that no
    machine load changes."""
    count = 0

    def trace(frame, event, arg):
        nonlocal count
        count += 1
        return trace

    def profile(frame, event, arg):
        nonlocal count
        count += event == "c_call"

    sys.settrace(trace)
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.settrace(None)
        sys.setprofile(None)
    return count


def test_guard_and_expression_checks_are_linear():
    """Four times a guard's or an expression's length is at most about four times the work of checking
    it (lines executed and C calls, counted after a first call that fills any cache)."""
    guard = lambda n: untrusted.check_guard(" and ".join(["L['x'].size()[0] <= 64"] * n), {"x"}, "t")
    expr = lambda n: untrusted.check_expr(" + ".join(f"{i}*s{i % 8}" for i in range(n)), "t")
    for check, n in ((guard, 30), (expr, 30)):
        check(4 * n)
        small, large = _steps(lambda: check(n)), _steps(lambda: check(4 * n))
        assert 3 * small < large < 4.4 * small, (check, small, large)


# ---- 4. sympy blow-up ----

@pytest.mark.parametrize("expr", [
    "Max(" + ", ".join(f"s{i}" for i in range(120)) + ")",  # the 494-character expression
    "s0",  # placeholder: replaced by a nested Max below
])
def test_expressions_that_sympy_compares_pairwise_are_capped(tmp_path, work, expr):
    if expr == "s0":
        for i in range(1, 40):
            expr = f"Max({expr}, s{i})"  # flattened by sympy into one Max of 40: as slow
    assert len(expr) <= untrusted.MAX_EXPR_LEN
    path = _exported(tmp_path, model=Dyn(), args=(torch.randn(4, 3),),
                     dynamic_shapes={"x": {0: torch.export.Dim("b", min=2, max=64)}})

    def edit(serialized, program):
        g = serialized.graph_module
        meta = next(iter(g.graph.tensor_values.values()))
        meta.sizes[0] = S.SymInt.create(as_expr=S.SymExpr(expr))
        for i in range(120):
            serialized.range_constraints[f"s{i}"] = S.RangeConstraint(min_val=2, max_val=64 + i)

    rewrite_artifact(path, path, edit=edit)
    _every_command(path, work, CorruptArtifactError, "Max/Min/Piecewise|more than 12 symbols|nests more than")


def test_expression_caps_accept_what_torch_writes():
    for expr in ("Max(1, s0)", "Min(s0, 512)", "Max(0, Min(s0, s1 - 1))", "s0*s1*64 + s0*64 + 64",
                 " + ".join(f"{i}*s{i % 12}" for i in range(100)), "Piecewise((s0, Eq(s1, 1)), (s1, True))",
                 # srepr's spelling, as torch writes sizes (a transformers decoder's)
                 "Mul(FloorDiv(Mul(Add(Mul(Integer(2), Symbol('s70', positive=True, integer=True)), Integer(-1)), "
                 "FloorDiv(Pow(Symbol('s70', positive=True, integer=True), Integer(2)), Symbol('s70', positive=True, "
                 "integer=True))), Integer(2)), Integer(4))"):
        untrusted.check_expr(expr, "t")
    refused = {
        "nests deeper": "-" * 150 + "s0",
        "more than 5 non-constant factors": "*".join(f"(s{i} + 1)" for i in range(6)),
        "multiplies more than 5": "Mul(" + ", ".join(f"Symbol('s{i}', integer=True)" for i in range(6)) + ")",
        "nests more than 8 function calls": "FloorDiv(" * 9 + "s0" + ", s1)" * 9,
        "more than 12 symbols": " + ".join(f"s{i}" for i in range(13)),
    }
    for why, expr in refused.items():
        with pytest.raises(CorruptArtifactError, match=why):
            untrusted.check_expr(expr, "t")


# ---- 5. sizes whose element count or extent overflows, or claims more than the file holds ----

def _set_record(path, name_part: str, sizes, strides):
    def edit(serialized, program):
        rec = next(r for r in program.tensors if name_part in r.name.decode())
        rec.sizes, rec.strides = list(sizes), list(strides)

    rewrite_artifact(path, path, edit=edit)


def test_tensor_record_whose_element_count_overflows(tmp_path, work):
    path = _exported(tmp_path)
    _set_record(path, "l1.weight", [2**62, 2**62], [0, 0])
    _every_command(path, work, CorruptArtifactError, "more than an int64 can count")


def test_zero_stride_example_input_claiming_terabytes(tmp_path, work):
    path = _exported(tmp_path)
    example = next(n for n in _record_names(path) if "l1" not in n and "l2" not in n)
    _set_record(path, example, [2**40], [0])
    _every_command(path, work, CorruptArtifactError, "more than the .*-byte file holds")


def _record_names(path):
    from exporter.serialize import reader

    art = reader.open_artifact(path)
    return [reader.text(r.name) for r in art.program.tensors]


def test_graph_tensor_metadata_that_overflows(tmp_path, work):
    path = _exported(tmp_path)

    def edit(serialized, program):
        meta = next(iter(serialized.graph_module.graph.tensor_values.values()))
        meta.sizes = [S.SymInt.create(as_int=2**62), S.SymInt.create(as_int=2**62)]
        meta.strides = [S.SymInt.create(as_int=0), S.SymInt.create(as_int=0)]

    rewrite_artifact(path, path, edit=edit)
    _every_command(path, work, CorruptArtifactError, "more than an int64 can count")


# ---- 8. only regular files are opened ----

def test_fifo_named_like_an_artifact_never_blocks(tmp_path):
    """Run in a child process with a deadline: a blocked open would otherwise hang the suite."""
    folder = tmp_path / "models"
    folder.mkdir()
    os.mkfifo(folder / "x.pt2b")
    script = f"""
import sys
from exporter import load, load_for_backend
from exporter.cli import main
from exporter.errors import NotAnArtifactError
p = {str(folder / 'x.pt2b')!r}
for step in (lambda: load(p), lambda: load_for_backend(p, cache=False)):
    try:
        step()
        sys.exit("loaded a FIFO")
    except NotAnArtifactError as e:
        assert "FIFO" in str(e), e
assert main(["--quiet", "inspect", p]) == 2
assert main(["--quiet", "verify", p]) == 2
assert main(["--quiet", "upgrade", {str(folder)!r}]) == 1
print("done")
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         cwd=pathlib.Path(__file__).parents[2])
    assert out.returncode == 0 and "done" in out.stdout, out.stdout + out.stderr
    with pytest.raises(NotAnArtifactError, match="is a FIFO"):
        load(folder / "x.pt2b")
    with pytest.raises(NotAnArtifactError, match="is a directory"):
        load(folder)


# ---- 6 and 7. the lowering cache cannot lie ----

def _forge_crc32(data: bytearray, at: int, target: int) -> None:
    """Change data[at:at+4] so that zlib.crc32(data) == target (CRC32 is affine over GF(2): the 32 bits
    of a 4-byte window move it independently, so solving one linear system forges any value)."""
    import zlib

    base = zlib.crc32(data)
    columns = []
    for bit in range(32):
        data[at + bit // 8] ^= 1 << (bit % 8)
        columns.append((zlib.crc32(data) ^ base, 1 << bit))
        data[at + bit // 8] ^= 1 << (bit % 8)
    want, chosen = base ^ target, 0
    rows = []  # Gaussian elimination: (pivot value, the window bits that make it)
    for value, bits in columns:
        for pivot, pbits in rows:
            if value ^ pivot < value:
                value, bits = value ^ pivot, bits ^ pbits
        if value:
            rows.append((value, bits))
            rows.sort(reverse=True)
    for pivot, pbits in rows:
        if want ^ pivot < want:
            want, chosen = want ^ pivot, chosen ^ pbits
    assert want == 0
    for bit in range(32):
        if chosen >> bit & 1:
            data[at + bit // 8] ^= 1 << (bit % 8)
    assert zlib.crc32(data) == target


def _swapped_weights(trusted: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
    """``trusted`` with every weight segment's bytes changed and each segment's CRC32 forged back to
    the recorded one: the program section stays byte for byte the trusted file's."""
    import zlib

    from exporter.serialize import reader

    art = reader.open_artifact(trusted)
    segments = [(art.header.data_offset + int(s.offset), int(s.nbytes), int(s.checksum)) for s in art.program.segments]
    art.mm.close()
    data = bytearray(trusted.read_bytes())
    for start, n, crc in segments:
        if n >= 8:
            data[start:start + n - 4] = bytes(b ^ 0x5A for b in data[start:start + n - 4])
            seg = bytearray(data[start:start + n])
            _forge_crc32(seg, n - 4, crc)
            data[start:start + n] = seg
            assert zlib.crc32(data[start:start + n]) == crc
    dest.write_bytes(bytes(data))
    return dest


@pytest.mark.parametrize("version", [None, (1, 2)], ids=["digests", "1.2-no-digests"])
def test_forged_weights_never_share_the_trusted_files_cache_entry(tmp_path, cache_dir, version):
    torch.manual_seed(0)
    model = Mlp()
    x = torch.randn(2, 4)
    trusted = tmp_path / "trusted.pt2b"
    from exporter.serialize import writer

    if version is None:
        export_model(model, (x,), trusted)
    else:
        writer.write_artifact(torch.export.export(model, (x,)), trusted, ir_level="training", version=version)
    hostile = _swapped_weights(trusted, tmp_path / "hostile.pt2b")
    from exporter.lowering import cache
    from exporter.serialize import reader

    assert reader.program_digest(hostile) == reader.program_digest(trusted)  # CRC32 forged: same program section
    expected = model(x)
    if version is None:  # the sha256 digests tell the weights apart
        with pytest.raises(CorruptArtifactError, match="checksum mismatch"):
            load(hostile, verify=True)
        # lowered first, the hostile file is refused when its lowering would be stored
        with pytest.raises(CorruptArtifactError, match="does not hold the bytes the program section's digest records"):
            load_for_backend(hostile)
        assert not cache.entries(cache_dir)
    else:  # a 1.2 file records CRC32 only (forged here): its key holds its weights' own sha256
        load(hostile, verify=True)
        assert not torch.equal(load_for_backend(hostile)(x), expected)  # its own weights, its own entry
    lowered = load_for_backend(trusted)
    assert not lowered.from_cache
    torch.testing.assert_close(lowered(x), expected)
    hit = load_for_backend(trusted)
    assert hit.from_cache
    torch.testing.assert_close(hit(x), expected)
    if version is None:  # the trusted entry exists now: the hostile file with verify=True is refused
        with pytest.raises(CorruptArtifactError, match="checksum mismatch"):
            load_for_backend(hostile, verify=True)
    else:
        assert not torch.equal(load_for_backend(hostile, verify=True)(x), expected)
    torch.testing.assert_close(load_for_backend(trusted, verify=True)(x), expected)


def test_cache_entry_with_overwritten_weights_is_discarded_under_verify(tmp_path, cache_dir):
    from exporter.lowering import cache
    from exporter.serialize import reader

    torch.manual_seed(0)
    model = Mlp()
    x = torch.randn(2, 4)
    path = _exported(tmp_path, model=model, args=(x,))
    load_for_backend(path)
    (entry,) = cache.entries(cache_dir)
    art = reader.open_artifact(entry)
    start = art.header.data_offset + int(art.program.segments[0].offset)
    art.mm.close()
    data = bytearray(entry.read_bytes())
    data[start:start + 16] = b"\x00" * 16  # the first weights of the entry overwritten in place
    entry.write_bytes(bytes(data))
    served = load_for_backend(path, verify=True)
    assert not served.from_cache  # the entry failed its digests: removed and lowered again
    torch.testing.assert_close(served(x), model(x))
    (rewritten,) = cache.entries(cache_dir)
    load(rewritten, verify=True)  # the new entry is whole
    again = load_for_backend(path, verify=True)
    assert again.from_cache
    torch.testing.assert_close(again(x), model(x))


_PEAK_SCRIPT = """
import resource, sys, torch
from exporter import load, load_for_backend
from exporter.errors import ArtifactError
def call(p):  # the first call, on the program's stored example inputs
    args, kwargs = load(p).exported_program().example_inputs
    load(p)(*args, **kwargs)
for step in (lambda p: load(p).check(), call, lambda p: load_for_backend(p, cache=False)):
    for path in sys.argv[1:]:
        try:
            step(path)
        except ArtifactError:
            pass
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)  # KiB on Linux
"""


def _peak_kib(*paths) -> int:
    out = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, *map(str, paths)], capture_output=True, text=True,
                         timeout=300, cwd=pathlib.Path(__file__).parents[2])
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.split()[-1])


def test_attack_files_take_no_more_memory_than_a_clean_file(tmp_path):
    """The memory half of "bounded": a process that loads, checks, calls and lowers every attack file
    of this module (each refused) peaks within 200 MB of one that does so with the clean file."""
    clean = _exported(tmp_path, "clean.pt2b")
    attacks = []
    for name, sizes, strides in (("w", [2**62, 2**62], [0, 0]), ("example", [2**40], [0])):
        path = tmp_path / f"{name}.pt2b"
        path.write_bytes(clean.read_bytes())
        part = "l1.weight" if name == "w" else next(n for n in _record_names(path) if "l1" not in n and "l2" not in n)
        _set_record(path, part, sizes, strides)
        attacks.append(path)
    chain = _exported(tmp_path, "chain.pt2b", Chain(), (torch.randn(3),))
    attacks.append(share_graph_across_methods(chain, tmp_path / "shared.pt2b", 300))
    expr = tmp_path / "expr.pt2b"
    export_model(Dyn(), (torch.randn(4, 3),), expr, dynamic_shapes={"x": {0: torch.export.Dim("b", min=2, max=64)}})

    def grow(serialized, program):
        meta = next(iter(serialized.graph_module.graph.tensor_values.values()))
        meta.sizes[0] = S.SymInt.create(as_expr=S.SymExpr("*".join(f"s{i}" for i in range(12))))

    rewrite_artifact(expr, expr, edit=grow)
    attacks.append(expr)
    baseline, hostile = _peak_kib(clean), _peak_kib(*attacks)
    assert hostile < baseline + 200 * 1024, (baseline, hostile)
