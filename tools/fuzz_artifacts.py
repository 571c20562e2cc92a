"""Mutation fuzzer for .pt2b artifacts: every mutant is loaded, lowered and run in an isolated worker.

    python tools/fuzz_artifacts.py --mutants 100000 --seed 1 --workers 2 [--json out.json]
    python tools/fuzz_artifacts.py --replay 1:4711 [--out mutant.pt2b] [--run]

Seed artifacts: small zoo models (``--models``) exported to a temporary folder. Mutant ``i`` of seed
``s`` depends only on (s, i) and the seed artifacts (which export byte-for-byte deterministically),
so any finding is replayed with ``--replay s:i``, whatever the number of workers.

Mutation kinds (``KINDS``: name -> weight in percent):
  raw (checksums left as they are; the header/program CRCs must catch them):
    bitflip, bitflip_data, byte_run, truncate_boundary (header end, each segment start/end, data
    end, program start/end, +-1/4/8), truncate_random, extend (append/insert bytes), swap_sections
    (two segments, data<->program, random chunks; one variant moves the program before the data
    and repairs the header: a legal layout), garbage (random files; some with a valid header and
    program CRC so the FlatBuffers parser sees noise), empty
  checksum-repaired (program CRC and header CRC recomputed so the mutant reaches the FlatBuffers
  parser, torch's deserializer, the lowering and the runtime):
    huge_header_field (header_size/offsets/sizes/alignment/version set to huge or edge values),
    repaired_header (bit flips), repaired_program (bit flips, byte runs, inserts, deletes),
    fb_length (u32 words of the program that look like vector lengths/offsets set huge),
    struct_fb (one field of the decoded FlatBuffers object tree: strings, ints, enum tags, list
    lengths, tensor records, segments, operators, metadata), struct_schema (one field of torch's
    export schema tree decoded by program_codec: node targets, symbolic expressions, names, ints,
    enums, lists, union members; or one name renamed consistently everywhere, tensor records
    included). Names are also set to code-injection payloads that call a canary (``CANARY``).
    struct_guards (GUARDS_SHARE of the struct_schema draws, from their own random stream so the
    other mutants stay as they were): guards_code, which ep.module() exec()s, extended with
    torch-like guards, guards over unknown arguments, huge powers and canary payloads.

Execution: a persistent worker process (torch imported once, RLIMIT_AS set) takes one mutant at a
time: ``load(path, verify=v)`` (v random per mutant), runs the loaded program eagerly on the seed's
example inputs, then ``Runtime(load_for_backend(path, preset, verify=v))`` (preset "none" or
"core") and compares both with the seed's own outputs (bitwise). The parent kills a worker that
exceeds the per-mutant limit (``timeout``) and restarts a worker that died (``crash``).

Outcome classes and the rule that decides whether an outcome is allowed (``allowed()``):
  ok_equal                   loaded and ran; every output bitwise equal to the seed's     allowed
  artifact_error:<Class>     an ArtifactError subclass (from load or later)                allowed
  lowering_error:<Class>     LoweringError/OpsetError/RuntimeInputError after a good load  allowed iff changed
  mismatch                   loaded and ran, outputs differ                                allowed iff changed
  run_error:<Type>           after a good load, torch rejecting the program while running
                             or lowering it: RuntimeError, ValueError, IndexError, TypeError,
                             ZeroDivisionError, OverflowError, NotImplementedError
                             (TOLERATED_RUN_ERRORS, RecursionError excepted), and
                             run_error:InputGuardFailed (ep.module()'s input-shape guard)  allowed iff changed
  memory                     MemoryError / allocator failure under RLIMIT_AS               allowed iff changed
                                                                                           and after the load
  other:<Type>               any other exception: raised by load; after a load of an       never
                             unchanged program; an internal-invariant error (AssertionError,
                             AttributeError, KeyError, RecursionError...) after any load; or
                             verify=True accepted damaged weights; other:CodeExecution: text
                             from the file ran as Python (the worker's canary was called or an
                             os.system/subprocess audit event fired)
  crash                      the worker died (signal, abort)                               never
  timeout                    the mutant exceeded the per-mutant time limit                 allowed iff changed
                             (a changed size literal may ask torch for hours of compute,   and while torch
                             as any model format may: run untrusted models under limits)   runs the graph
"changed": the mutant, as loaded, is a genuinely different program from its seed: after load the
worker re-decodes it and compares (a) torch's schema tree of the program with node/graph metadata
(stack traces, module stacks: no effect on execution) stripped, (b) every tensor record (name,
kind, dtype, sizes, strides, offset, segment), (c) the bytes of every weight segment as the
mutant's header and segment table locate them. With verify=False weight bytes are not checked by
design (O(graph) load), so a flip in the data section is a changed program and its mismatch is
allowed; with verify=True a segment whose bytes fail its CRC must have been refused.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import enum
import hashlib
import json
import math
import os
import random
import re
import shutil
import struct
import sys
import tempfile
import time
import traceback
import zlib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

DEFAULT_MODELS = ("mlp", "cnn_bn", "cond", "dynamic_shapes", "buffer_mutation")
PRESETS = ("none", "core")

# kind -> weight (percent of mutants)
KINDS = {
    "bitflip": 9,
    "bitflip_data": 5,
    "byte_run": 6,
    "truncate_boundary": 6,
    "truncate_random": 3,
    "extend": 2,
    "swap_sections": 4,
    "garbage": 4,
    "empty": 1,
    "huge_header_field": 8,
    "repaired_header": 5,
    "repaired_program": 14,
    "fb_length": 6,
    "struct_fb": 13,
    "struct_schema": 14,
}
assert sum(KINDS.values()) == 100
GUARDS_SHARE = 0.08  # of struct_schema mutants: guards_code edits ("struct_guards", own random stream)
GUARDS_SALT = 0x6A4D_0000_0002  # chosen so that no FIXED regression mutant in tests/test_fuzz.py moves

HEADER_FMT = struct.Struct("<4sHHIIQQQQIIQ")
HEADER_FIELDS = {  # name -> (offset, struct format)
    "major": (4, "<H"), "minor": (6, "<H"), "header_size": (8, "<I"), "flags": (12, "<I"),
    "data_offset": (16, "<Q"), "data_size": (24, "<Q"), "program_offset": (32, "<Q"),
    "program_size": (40, "<Q"), "program_crc": (48, "<I"), "alignment": (56, "<Q"),
}

# What torch raises when a kernel, a fake-tensor propagation or a decomposition rejects a program
# that is well formed but inconsistent (a crafted size, a swapped argument): tolerated after a good
# load of a changed program. Internal-invariant errors (AssertionError, AttributeError, KeyError,
# RecursionError...) are not: load() should have refused the program with an ArtifactError.
TOLERATED_RUN_ERRORS = (RuntimeError, ValueError, IndexError, TypeError, ZeroDivisionError, OverflowError,
                        NotImplementedError)

EXEC_PHASES = ("fingerprint", "eager", "load_for_backend", "runtime", "run")  # after a good load
GRAPH_PHASES = ("eager", "run")  # torch executing the program's own graph


# ==============================================================================================
# Outcome rule
# ==============================================================================================


def allowed(outcome: str, changed: bool | None, phase: str | None = None) -> bool:
    """Is ``outcome`` acceptable for a mutant? (the rule in the module docstring)"""
    if outcome == "ok_equal" or outcome.startswith("artifact_error:"):
        return True
    if changed is not True:
        return False
    if outcome == "mismatch" or outcome.startswith(("lowering_error:", "run_error:")):
        return True
    if outcome == "memory":
        return phase in EXEC_PHASES
    if outcome == "timeout":  # a changed literal may ask for any amount of compute; pt2b's own code may not hang
        return phase in GRAPH_PHASES
    return False


# ==============================================================================================
# Seed artifacts
# ==============================================================================================


def export_seeds(models, folder) -> dict[str, str]:
    """Export each zoo case in ``models`` to ``folder``/<name>.pt2b; name -> path."""
    from exporter import export_model
    from exporter.corpus.zoo import make_case

    os.makedirs(folder, exist_ok=True)
    out = {}
    for name in models:
        path = os.path.join(folder, f"{name}.pt2b")
        if not os.path.exists(path):
            case = make_case(name)
            tmp = path + ".tmp.pt2b"
            export_model(case.model, case.args, tmp, kwargs=case.kwargs, dynamic_shapes=case.dynamic_shapes,
                         strict=case.strict)
            os.replace(tmp, path)
        out[name] = path
    return out


class Seed:
    """A pristine artifact and everything the mutators need to know about its layout."""

    def __init__(self, name: str, data: bytes):
        from exporter.serialize.generated import pt2b_generated as G

        self.name, self.data = name, data
        (_, self.major, self.minor, self.header_size, self.flags, self.d_off, self.d_size, self.p_off,
         self.p_size, _, _, self.alignment) = HEADER_FMT.unpack_from(data, 0)
        self.program = data[self.p_off:self.p_off + self.p_size]
        tree = G.ProgramT.InitFromPackedBuf(self.program, 0)
        self.segments = [(self.d_off + int(s.offset), int(s.nbytes)) for s in tree.segments or []]
        b = {"preamble end": 8, "header end": 64, "data start": self.d_off,
             "data end": self.d_off + self.d_size, "program start": self.p_off,
             "program end": self.p_off + self.p_size, "program middle": self.p_off + self.p_size // 2}
        for i, (off, n) in enumerate(self.segments):
            b[f"segment {i} start"] = off
            b[f"segment {i} end"] = off + n
        self.boundaries = sorted(b.items(), key=lambda kv: (kv[1], kv[0]))
        words = [(i, struct.unpack_from("<I", self.program, i)[0]) for i in range(0, self.p_size - 3, 4)]
        self.small_words = [i for i, v in words if 0 < v < 4096]
        self.strings = sorted(_collect_strings(self._schema_tree()))

    def program_tree(self):
        from exporter.serialize.generated import pt2b_generated as G

        return G.ProgramT.InitFromPackedBuf(self.program, 0)

    def _schema_tree(self, tree=None):
        from torch._export.serde import schema as S

        from exporter.serialize import program_codec

        tree = tree or self.program_tree()
        return program_codec.decode(S.ExportedProgram, tree.exportedProgram, "seed")


def _collect_strings(root) -> set[str]:
    out = set()
    for _, _, v, _ in _schema_slots(root):
        if isinstance(v, str) and len(v) < 200:
            out.add(v)
    return out


# ==============================================================================================
# Mutations
# ==============================================================================================


@dataclasses.dataclass
class Mutant:
    seed: int
    index: int
    model: str
    kind: str
    desc: str
    data: bytes
    verify: bool
    preset: str

    def replay(self) -> str:
        return f"python tools/fuzz_artifacts.py --replay {self.seed}:{self.index} --run"


EVIL_TARGETS = [
    "torch.os.system", "builtins.eval", "torch.ops.aten.__class__.__init__", "torch.load", "os.system",
    "torch.ops.aten.add_.Tensor", "torch.ops.aten.mul.Tensor", "torch.ops.aten.sigmoid.default",
    "torch.ops.aten.relu.default", "torch.ops.aten.no_such_op.default", "torch.ops.no_such_ns.op.default",
    "torch.ops.higher_order.cond", "torch.ops.higher_order.while_loop", "torch.ops.higher_order.map_impl",
    "torch.ops.higher_order.no_such_hop", "_operator.getitem", "_operator.mul", "_operator.floordiv",
    "_operator.truediv", "math.trunc", "torch.sym_max", "torch.sym_float", "torch.ops.pt2b_zoo.scaled_add.default",
    "torch.ops.aten.view.default", "torch.ops.aten.empty.memory_format", "torch.ops.aten.full.default",
    "torch.ops.aten._assert_async.msg", "torch.ops.aten.sym_size.int", "torch.ops.aten.as_strided.default",
    "torch.ops.aten.copy_.default", "torch.ops.aten.detach_.default", "torch.ops.aten.linear.default",
    "torch.ops.aten.t.default", "torch.ops.aten.addmm.default", "torch.ops.aten._local_scalar_dense.default",
    "torch.ops.aten.set_.source_Storage", "torch.ops.aten.resize_.default", "torch.ops.aten.index.Tensor",
    "torch.ops.aten.sym_constrain_range_for_size.default", "torch.ops.aten._assert_scalar.default",
    "torch.ops.aten.item.default", "torch.ops.aten.add", "torch.ops.aten", "torch.ops", "",
]
EXPRESSIONS = [
    "s0", "s77", "s0 + 1", "2*s0", "s0**2", "s0*s1", "u0", "-s0", "s0 - s0", "FloorDiv(s0, 2)",
    "FloorDiv(s0, 0)", "Mod(s0, 0)", "1/0", "zoo", "oo", "-oo", "nan", "int_oo", "Max(s0, oo)",
    "Piecewise((1, s0 > 0), (0, True))", "Eq(s0, 1)", "s0 >= 2", "True", "False", "0", "-1", "1.5",
    "Symbol('s0', positive=True, integer=True)", "Mul(Integer(2), Symbol('s0', integer=True))",
    "9**9**9**9", "s0**99999999", "10**10**10", "2**(2**40)", "Integer(10)**Integer(10)**Integer(10)",
    "Rational(1, 0)", "Float('nan')", "sqrt(-1)", "__import__('os')", "s0.__class__", "lambda: 1",
    "(" * 200 + "s0" + ")" * 200, "s0" + "+s0" * 1500, "s0" + "+s0" * 3000, "1e308*10", "", "s0 s1",
    "Min()", "Max(s0)", "IsNonOverlappingAndDenseIndicator(s0)", "FloorDiv(s0, s1)",
    "s999999999999999999999", "Symbol('')", "Symbol('s0', commutative=False)", "Eq(s0)",
    "Integer(1.5)", "Float(1, precision=99999999)", "Integer('9'*4000)", "ModularIndexing(s0, 0, 0)",
    "Abs(", "(s0", "s0)", "s0 = 1", "s0 == 1 == 2", "~s0", "s0 & s1", "s0 | True", "s0 % 0",
]
# Strings that execute the worker's canary if a name from the file is pasted into generated Python
# source unescaped (fx codegen, ep.module(), guard functions): a hit is outcome other:CodeExecution.
CANARY = "PT2B_FUZZ_CANARY"
INJECTIONS = [
    f'x="""):\n    {CANARY}()\n    return 0 #',
    f'x={CANARY}()):#',
    f'a")+{CANARY}()+getattr(self,"b',
    f"a')+{CANARY}()+getattr(self,'b",
    f'{CANARY}()',
    f'__import__("builtins").{CANARY}()',
    f"x\n{CANARY}()\n",
    f'x=1, y={CANARY}()',
    f"{{{CANARY}()}}",
    f"a\\\"+{CANARY}()+\"",
]
INT_SPECIALS = [0, 1, -1, 2, 3, 7, 64, 2**31 - 1, -(2**31), 2**32, 2**62, 2**63 - 1, -(2**63)]
FLOAT_SPECIALS = [0.0, -0.0, float("nan"), float("inf"), float("-inf"), 1e308, 5e-324, 1.0, -1.0]


class Mutator:
    """Mutant ``index`` of seed ``seed`` over the given seed artifacts (name -> bytes)."""

    def __init__(self, seeds: dict[str, bytes]):
        self.names = sorted(seeds)
        self.seeds = {n: Seed(n, seeds[n]) for n in self.names}
        self._kinds = list(KINDS)
        self._weights = [KINDS[k] for k in self._kinds]

    @staticmethod
    def rng_for(seed: int, index: int) -> random.Random:
        h = hashlib.sha256(f"pt2b-fuzz:{seed}:{index}".encode()).digest()
        return random.Random(int.from_bytes(h[:16], "little"))

    def mutant(self, seed: int, index: int, kind: str | None = None) -> Mutant:
        rng = self.rng_for(seed, index)
        model = rng.choice(self.names)
        drawn = rng.choices(self._kinds, self._weights)[0]
        kind = kind or drawn  # a forced kind keeps the rest of the stream
        verify = rng.random() < 0.5
        preset = "none" if rng.random() < 0.75 else "core"
        s = self.seeds[model]
        if kind == "struct_schema":  # a share of them edit guards_code, decided off the main stream
            aux = self.rng_for(seed, index + GUARDS_SALT)
            if aux.random() < GUARDS_SHARE:
                rng = aux
                kind = "struct_guards"
        for attempt in range(20):
            try:
                data, desc = getattr(self, "_m_" + kind)(rng, s)
                break
            except _Retry:
                continue
        else:  # a structured mutation that never encoded: fall back to repaired program bytes
            kind = "repaired_program"
            data, desc = self._m_repaired_program(rng, s)
        return Mutant(seed, index, model, kind, desc, bytes(data), verify, preset)

    # ---- raw ----
    def _m_bitflip(self, rng, s, lo=0, hi=None):
        buf = bytearray(s.data)
        hi = len(buf) if hi is None else hi
        n = rng.choice((1, 1, 1, 2, 3, 8))
        flips = []
        for _ in range(n):
            p, bit = rng.randrange(lo, hi), rng.randrange(8)
            buf[p] ^= 1 << bit
            flips.append(f"{p}:{bit}")
        return buf, f"flip bits {','.join(flips)} ({_region(s, int(flips[0].split(':')[0]))})"

    def _m_bitflip_data(self, rng, s):
        if s.d_size == 0:
            return self._m_bitflip(rng, s)
        return self._m_bitflip(rng, s, s.d_off, s.d_off + s.d_size)

    def _m_byte_run(self, rng, s):
        buf = bytearray(s.data)
        p = rng.randrange(len(buf))
        n = min(rng.choice((1, 2, 4, 8, 16, 64, 256)), len(buf) - p)
        fill = rng.choice(("random", "zero", "ff", "repeat"))
        run = _fill_bytes(rng, fill, n)
        buf[p:p + n] = run
        return buf, f"overwrite {n} bytes at {p} with {fill} ({_region(s, p)})"

    def _m_truncate_boundary(self, rng, s):
        label, b = rng.choice(s.boundaries)
        delta = rng.choice((0, 0, 0, -1, 1, -4, 4, -8, 8))
        n = max(0, min(len(s.data) - 1, b + delta))
        return s.data[:n], f"truncate to {n} bytes ({label} {delta:+d})"

    def _m_truncate_random(self, rng, s):
        n = rng.randrange(len(s.data))
        return s.data[:n], f"truncate to {n} bytes ({_region(s, n)})"

    def _m_extend(self, rng, s):
        extra = _fill_bytes(rng, rng.choice(("random", "zero")), rng.choice((1, 7, 64, 4096)))
        if rng.random() < 0.5:
            return s.data + extra, f"append {len(extra)} bytes"
        p = rng.randrange(len(s.data))
        return s.data[:p] + extra + s.data[p:], f"insert {len(extra)} bytes at {p} ({_region(s, p)})"

    def _m_swap_sections(self, rng, s):
        buf = bytearray(s.data)
        segs = [(o, n) for o, n in s.segments if n > 0]
        how = rng.choice(("segments", "segments", "program_first", "data_program_raw", "chunks", "segment_program"))
        if how == "segments" and len(segs) >= 2:
            (a, na), (b, nb) = rng.sample(segs, 2)
            n = min(na, nb)
            buf[a:a + n], buf[b:b + n] = s.data[b:b + n], s.data[a:a + n]
            return buf, f"swap first {n} bytes of segments at {a} and {b}"
        if how == "program_first":
            # legal alternative layout: program right after the header, data after it (aligned)
            data = s.data[s.d_off:s.d_off + s.d_size]
            p_off = 64
            d_off = -(-(p_off + s.p_size) // s.alignment) * s.alignment
            out = bytearray(s.data[:64]) + s.program + b"\0" * (d_off - p_off - s.p_size) + data
            struct.pack_into("<QQQQ", out, 16, d_off, s.d_size, p_off, s.p_size)
            _fix_header_crc(out)
            return out, f"move program before data (program at {p_off}, data at {d_off}), header repaired"
        if how == "data_program_raw":
            data = s.data[s.d_off:s.d_off + s.d_size]
            return s.data[:s.d_off] + s.program + data, "swap data and program sections (header untouched)"
        if how == "segment_program" and segs:
            a, na = rng.choice(segs)
            n = min(na, s.p_size)
            buf[a:a + n], buf[s.p_off:s.p_off + n] = s.data[s.p_off:s.p_off + n], s.data[a:a + n]
            return buf, f"swap first {n} bytes of segment at {a} and of the program"
        n = rng.choice((4, 8, 64, 512))
        a, b = rng.randrange(len(buf) - n), rng.randrange(len(buf) - n)
        buf[a:a + n], buf[b:b + n] = s.data[b:b + n], s.data[a:a + n]
        return buf, f"swap {n}-byte chunks at {a} and {b}"

    def _m_garbage(self, rng, s):
        n = int(2 ** rng.uniform(0, 16))
        body = bytearray(rng.getrandbits(8) for _ in range(n))
        how = rng.choice(("random", "preamble", "valid_header", "valid_header_real_program"))
        if how == "random":
            return body, f"{n} random bytes"
        if how == "preamble":
            return bytearray(b"PT2B" + struct.pack("<HH", s.major, s.minor)) + body, f"preamble + {n} random bytes"
        # a header with valid checksums over random (or foreign) sections
        program = bytes(body)
        if how == "valid_header":
            program = program[:4] + b"P2BF" + program[8:] if len(program) >= 8 else program
            desc = f"valid header, {len(program)}-byte random program with the file identifier"
            data = b""
        else:
            program = s.program
            data = bytes(rng.getrandbits(8) for _ in range(rng.choice((0, 64, 640, 4096))))
            desc = f"valid header, the seed's program, {len(data)} random data bytes"
        d_off = 64
        p_off = d_off + -(-len(data) // 64) * 64
        out = bytearray(64) + data + b"\0" * (p_off - d_off - len(data)) + program
        HEADER_FMT.pack_into(out, 0, b"PT2B", s.major, s.minor, 64, 0, d_off, len(data), p_off, len(program),
                             zlib.crc32(program), 0, 64)
        _fix_header_crc(out)
        return out, desc

    def _m_empty(self, rng, s):
        return b"", "empty file"

    # ---- checksum-repaired ----
    def _m_huge_header_field(self, rng, s):
        buf = bytearray(s.data)
        name = rng.choice([k for k in HEADER_FIELDS if k != "program_crc"])
        off, fmt = HEADER_FIELDS[name]
        bits = struct.calcsize(fmt) * 8
        cur = struct.unpack_from(fmt, buf, off)[0]
        size = len(buf)
        pool = [0, 1, 2**bits - 1, 2 ** (bits - 1), 2 ** (bits - 1) - 1, size, size + 1, size - 1, cur + 1, cur - 1,
                cur * 2, cur + 64, cur - 64, cur + 8, 2**32, 2**40, 2**64 - cur, 2**64 - 64]
        v = rng.choice(pool) % (2**bits)
        struct.pack_into(fmt, buf, off, v)
        _fix_header_crc(buf)
        return buf, f"header {name} {cur} -> {v}, header CRC repaired"

    def _m_repaired_header(self, rng, s):
        buf = bytearray(s.data)
        flips = []
        for _ in range(rng.choice((1, 1, 2, 4))):
            p = rng.choice([i for i in range(64) if not 52 <= i < 56])
            bit = rng.randrange(8)
            buf[p] ^= 1 << bit
            flips.append(f"{p}:{bit}")
        _fix_header_crc(buf)
        return buf, f"flip header bits {','.join(flips)}, header CRC repaired"

    def _m_repaired_program(self, rng, s):
        prog = bytearray(s.program)
        how = rng.choice(("flip", "flip", "flip", "run", "insert", "delete", "duplicate"))
        p = rng.randrange(len(prog))
        if how == "flip":
            flips = []
            for _ in range(rng.choice((1, 1, 2, 4))):
                q, bit = rng.randrange(len(prog)), rng.randrange(8)
                prog[q] ^= 1 << bit
                flips.append(f"{q}:{bit}")
            desc = f"flip program bits {','.join(flips)}"
        elif how == "run":
            n = min(rng.choice((1, 2, 4, 8, 32)), len(prog) - p)
            fill = rng.choice(("random", "zero", "ff"))
            prog[p:p + n] = _fill_bytes(rng, fill, n)
            desc = f"overwrite {n} program bytes at {p} with {fill}"
        elif how == "insert":
            n = rng.choice((1, 4, 8, 16))
            prog[p:p] = _fill_bytes(rng, "random", n)
            desc = f"insert {n} bytes at program offset {p}"
        elif how == "delete":
            n = rng.choice((1, 4, 8, 16))
            del prog[p:p + n]
            desc = f"delete {n} bytes at program offset {p}"
        else:
            n = rng.choice((4, 8, 32))
            q = rng.randrange(len(prog))
            prog[q:q] = prog[p:p + n]
            desc = f"copy {n} program bytes from {p} to {q}"
        return _with_program(s, bytes(prog)), desc + ", CRCs repaired"

    def _m_fb_length(self, rng, s):
        prog = bytearray(s.program)
        if s.small_words and rng.random() < 0.85:
            p = rng.choice(s.small_words)
        else:
            p = rng.randrange(0, len(prog) - 3) & ~3
        cur = struct.unpack_from("<I", prog, p)[0]
        v = rng.choice((0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, 0x10000000, 0xFFFFFFF0, cur + 1, cur * 16, len(prog),
                        len(prog) - p, 0)) % 2**32
        struct.pack_into("<I", prog, p, v)
        return _with_program(s, bytes(prog)), f"program u32 at {p}: {cur} -> {v}, CRCs repaired"

    def _m_struct_fb(self, rng, s):
        tree = s.program_tree()
        if rng.random() < 0.04:
            return _pack(s, tree), "re-pack the program unchanged (identity), CRCs repaired"
        slots = _fb_slots(tree)
        r = rng.random()
        if r < 0.08:
            names = [x for x in slots if x[3].endswith(".name") and x[3].startswith("program.tensors")]
            slots = names or slots
        elif r < 0.38:  # the program table outside the graph: tensors, segments, operators...
            top = [x for x in slots if not x[3].startswith("program.exportedProgram")]
            slots = top or slots
        parent, key, value, path = rng.choice(slots)
        new, what = _mutate_value(rng, value, s.strings, path, tree_objs=slots)
        if isinstance(parent, list):
            parent[key] = new
        elif new is _DELETE:
            setattr(parent, key, None)
        else:
            setattr(parent, key, new)
        if new is _DELETE and isinstance(parent, list):
            raise _Retry
        return _pack(s, tree), f"program table {path}: {what}, CRCs repaired"

    def _m_struct_guards(self, rng, s):
        """Set the program's guards_code (which ep.module() exec()s) to torch-like guards, guards over
        unknown arguments, huge powers or canary payloads."""
        from exporter.serialize import program_codec

        tree = s.program_tree()
        ep = s._schema_tree(tree)
        args = list(ep.graph_module.module_call_graph[0].signature.forward_arg_names or ["x"])
        arg = rng.choice(args + ["flat_args", "nope"])
        n = rng.choice(INT_SPECIALS)
        guards = [
            f"L['{arg}'].size()[0] >= 0", f"L['{arg}'].size()[0] == {n}", f"(L['{arg}'].size()[0] % 2) == 0",
            f"L['{arg}'].size()[0] <= 9**9**9", f"L['{arg}'].size()[0] == 1 or {CANARY}()", f"{CANARY}() is None",
            f"L['{arg}'].__class__ is None", f"torch.{CANARY}()", f"L['{arg}'].size()[0] == 'a\" + {CANARY}() + \"'",
            rng.choice(INJECTIONS), rng.choice(EXPRESSIONS),
        ]
        new = [rng.choice(guards) for _ in range(rng.choice((1, 1, 2)))]
        ep.guards_code = list(ep.guards_code or []) + new
        tree.exportedProgram = program_codec.encode(ep)
        return _pack(s, tree), f"guards_code += {[g[:80] for g in new]!r}, CRCs repaired"

    def _m_struct_schema(self, rng, s):
        from exporter.errors import ExportError
        from exporter.serialize import program_codec

        tree = s.program_tree()
        ep = s._schema_tree(tree)
        slots = _schema_slots(ep)
        r = rng.random()
        targets = [x for x in slots if x[3].endswith(".target") and isinstance(x[2], str)]
        exprs = [x for x in slots if x[3].endswith(".expr_str")
                 or (x[3].startswith("ep.range_constraints") and x[3].endswith("<key>"))]
        names = [x for x in slots if isinstance(x[2], str) and re.search(_NAME_PATH, x[3])]
        if 0.52 <= r < 0.64:  # rename one name everywhere (schema tree and tensor records) consistently
            old = rng.choice(sorted({x[2] for x in names} | {_text(t.name) for t in tree.tensors or []}))
            if "." in old and rng.random() < 0.3:  # a dotted attribute path: break out of getattr(self, "...")
                head = old.split(".")[0]
                new = f'{head}")+{CANARY}()+getattr(self,"{old}'
            else:
                new, _ = _mutate_value(rng, old, s.strings, ".name")
            n = 0
            for parent, key, value, _ in slots:
                if type(value) is str and value == old and not (type(key) is str and key == "<key>"):
                    if isinstance(parent, (list, dict)):
                        parent[key] = new
                    else:
                        setattr(parent, key, new)
                    n += 1
            for t in tree.tensors or []:
                if _text(t.name) == old:
                    t.name = new
                    n += 1
            try:
                tree.exportedProgram = program_codec.encode(ep)
            except (ExportError, TypeError, ValueError, AttributeError, KeyError, AssertionError, OverflowError):
                raise _Retry from None
            return _pack(s, tree), f"rename {old!r} -> {new[:80]!r} everywhere ({n} places), CRCs repaired"
        if r < 0.22 and targets:
            slots = targets
        elif r < 0.40 and exprs:
            slots = exprs
        elif r < 0.52 and names:
            slots = names
        parent, key, value, path = rng.choice(slots)
        if type(key) is str and key == "<key>":  # a dict key
            old = value
            new, what = _mutate_value(rng, old, s.strings, path)
            if not isinstance(new, str):
                raise _Retry
            d = parent
            items = [(new if k == old else k, v) for k, v in d.items()]
            d.clear()
            d.update(items)
        else:
            new, what = _mutate_value(rng, value, s.strings, path, tree_objs=slots)
            if new is _DELETE:
                new = None
            if isinstance(parent, (list, dict)):
                parent[key] = new
            else:
                setattr(parent, key, new)
        try:
            tree.exportedProgram = program_codec.encode(ep)
        except (ExportError, TypeError, ValueError, AttributeError, KeyError, AssertionError, OverflowError):
            raise _Retry from None
        return _pack(s, tree), f"schema {path}: {what}, CRCs repaired"


# names that end up in generated Python source or in attribute lookups
_NAME_PATH = re.compile(r"(forward_arg_names|_name|\.fqn|\.name|\.arg|in_spec|out_spec)(\[\d+\])?$")


class _Retry(Exception):
    pass


_DELETE = object()


def _text(b) -> str:
    return b.decode("utf-8", "replace") if isinstance(b, bytes) else (b or "")


def _fill_bytes(rng, fill: str, n: int) -> bytes:
    if fill == "zero":
        return bytes(n)
    if fill == "ff":
        return b"\xff" * n
    if fill == "repeat":
        return bytes([rng.getrandbits(8)]) * n
    return bytes(rng.getrandbits(8) for _ in range(n))


def _region(s: Seed, p: int) -> str:
    if p < 8:
        return "preamble"
    if p < 64:
        field = max((f for f in HEADER_FIELDS.items() if f[1][0] <= p), key=lambda f: f[1][0], default=None)
        return f"header {field[0] if field else ''}".strip() if p not in range(52, 56) else "header crc"
    for i, (off, n) in enumerate(s.segments):
        if off <= p < off + n:
            return f"segment {i}"
    if s.d_off <= p < s.d_off + s.d_size:
        return "data padding"
    if s.p_off <= p < s.p_off + s.p_size:
        return f"program+{p - s.p_off}"
    return "outside sections"


def _fix_header_crc(buf: bytearray) -> None:
    struct.pack_into("<I", buf, 52, zlib.crc32(bytes(buf[:52])))


def _with_program(s: Seed, program: bytes) -> bytearray:
    buf = bytearray(s.data[:s.p_off]) + program
    struct.pack_into("<Q", buf, 40, len(program))
    struct.pack_into("<I", buf, 48, zlib.crc32(program))
    _fix_header_crc(buf)
    return buf


def _pack(s: Seed, tree) -> bytearray:
    import flatbuffers

    from exporter.serialize.container import FILE_IDENTIFIER

    try:
        b = flatbuffers.Builder(1 << 16)
        b.Finish(tree.Pack(b), file_identifier=FILE_IDENTIFIER)
    except Exception:  # an int out of its field's range, a str where a table goes...
        raise _Retry from None
    return _with_program(s, bytes(b.Output()))


def _is_fb(v) -> bool:
    return type(v).__name__.endswith("T") and type(v).__module__.endswith("pt2b_generated")


def _fb_slots(root) -> list:
    """(parent, key, value, path) of every field of the FlatBuffers object tree, depth first."""
    out, stack = [], [(root, "program")]
    while stack:
        obj, path = stack.pop()
        for attr, v in vars(obj).items():
            p = f"{path}.{attr}"
            out.append((obj, attr, v, p))
            if _is_fb(v):
                stack.append((v, p))
            elif isinstance(v, list):
                for i, x in enumerate(v):
                    if _is_fb(x):
                        stack.append((x, f"{p}[{i}]"))
                    else:
                        out.append((v, i, x, f"{p}[{i}]"))
    return out


def _schema_slots(root) -> list:
    """(parent, key, value, path) of every value of a torch export-schema tree; dict keys get
    key "<key>" with the dict as parent."""
    from torch._export.serde.union import _Union

    out, stack = [], [(root, "ep")]
    while stack:
        obj, path = stack.pop()
        if isinstance(obj, _Union):
            children = [(obj.type, obj.value)]
        elif dataclasses.is_dataclass(obj):
            children = [(f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj)]
        elif isinstance(obj, list):
            children = list(enumerate(obj))
        elif isinstance(obj, dict):
            children = list(obj.items())
            for k in obj:
                out.append((obj, "<key>", k, f"{path}[{k!r}]<key>"))
        else:
            continue
        for k, v in children:
            p = f"{path}[{k}]" if isinstance(obj, (list, dict)) else f"{path}.{k}"
            out.append((obj, k, v, p))
            if isinstance(v, (list, dict, _Union)) or dataclasses.is_dataclass(v):
                stack.append((v, p))
    return out


def _mutate_value(rng, value, strings, path, tree_objs=()):
    """A mutated version of ``value`` and a description of the change."""
    from torch._export.serde.union import _Union

    short = lambda v: repr(v)[:60]  # noqa: E731
    if value is None:
        if path.endswith((".target", "Name", ".name")):
            v = rng.choice(EVIL_TARGETS)
            return v, f"None -> {short(v)}"
        raise _Retry
    if isinstance(value, bool):
        return (not value), f"{value} -> {not value}"
    if isinstance(value, enum.IntEnum):
        members = list(type(value))
        v = rng.choice(members + [len(members) + 5, -1, 255])
        return v, f"{short(value)} -> {short(v)}"
    if isinstance(value, int):
        v = rng.choice(INT_SPECIALS + [value + 1, value - 1, -value, value * 2, value + 2**32,
                                       rng.randint(-1000, 1000)])
        if v == value:
            v = value + 1
        return v, f"{value} -> {v}"
    if isinstance(value, float):
        v = rng.choice(FLOAT_SPECIALS + [value * 2, -value, value + 1])
        return v, f"{value} -> {v}"
    if isinstance(value, (str, bytes)):
        was_bytes = isinstance(value, bytes)
        text = value.decode("utf-8", "replace") if was_bytes else value
        v = _mutate_string(rng, text, strings, path)
        if was_bytes:
            v = v.encode("utf-8", "surrogatepass") if isinstance(v, str) else v
            if rng.random() < 0.05:
                v = b"\xff\xfe" + v
        return v, f"{short(value)} -> {short(v)}"
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ndarray":
        lst = list(value)
        how = rng.choice(("drop", "dup", "clear", "reverse", "swap", "elem", "elem"))
        if not lst and how != "dup":
            raise _Retry
        if how == "drop":
            i = rng.randrange(len(lst))
            del lst[i]
        elif how == "dup":
            if not lst:
                raise _Retry
            i = rng.randrange(len(lst))
            lst.insert(i, lst[i])
        elif how == "clear":
            lst = []
        elif how == "reverse":
            lst.reverse()
        elif how == "swap":
            if len(lst) < 2:
                raise _Retry
            i, j = rng.sample(range(len(lst)), 2)
            lst[i], lst[j] = lst[j], lst[i]
        else:
            i = rng.randrange(len(lst))
            lst[i], what = _mutate_value(rng, lst[i], strings, f"{path}[{i}]", tree_objs)
            if lst[i] is _DELETE:
                raise _Retry
            return lst, f"element {i}: {what}"
        return lst, f"list of {len(value)} -> {how} ({len(lst)})"
    if isinstance(value, dict):
        d = dict(value)
        if not d:
            raise _Retry
        how = rng.choice(("drop", "clear", "elem"))
        k = rng.choice(list(d))
        if how == "drop":
            del d[k]
        elif how == "clear":
            d = {}
        else:
            d[k], what = _mutate_value(rng, d[k], strings, f"{path}[{k!r}]", tree_objs)
            if d[k] is _DELETE:
                raise _Retry
            return d, f"entry {k!r}: {what}"
        return d, f"dict {how} {k!r}"
    # a table / dataclass / union: delete it or swap in another of the same class from the tree
    same = [x[2] for x in tree_objs if type(x[2]) is type(value) and x[2] is not value]
    if same and rng.random() < 0.6:
        import copy

        other = copy.deepcopy(rng.choice(same))
        return other, f"replaced by another {type(value).__name__}" + (
            f" ({value.type} -> {other.type})" if isinstance(value, _Union) else "")
    return _DELETE, f"{type(value).__name__} deleted"


def _mutate_string(rng, text: str, strings, path: str):
    r = rng.random()
    if path.endswith(".target") and r < 0.6:
        return rng.choice(EVIL_TARGETS + [x for x in strings if x.startswith("torch.ops.")])
    if (path.endswith(".expr_str") or path.endswith("<key>")) and r < 0.7:
        return rng.choice(EXPRESSIONS)
    if re.search(_NAME_PATH, path) and r < 0.4:
        inj = rng.choice(INJECTIONS)
        return rng.choice((inj, text + inj))
    how = rng.choice(("other", "other", "empty", "truncate", "append", "char", "long", "nul", "expr", "target",
                      "inject", "inject"))
    if how == "inject":
        inj = rng.choice(INJECTIONS)
        return rng.choice((inj, text + inj, inj + text))
    if how == "other" and strings:
        return rng.choice(strings)
    if how == "empty":
        return ""
    if how == "truncate" and text:
        return text[: rng.randrange(len(text))]
    if how == "append":
        return text + rng.choice(("_", "0", ".", "\u00e9", "'", '"', "\\", " ", "\n", "-", "#", ")"))
    if how == "char" and text:
        i = rng.randrange(len(text))
        return text[:i] + chr(rng.choice((0x21 + rng.randrange(94), 0xe9, 0x2603))) + text[i + 1:]
    if how == "long":
        return text * rng.choice((100, 5000)) if text else "x" * 100000
    if how == "nul":
        return text + "\0"
    if how == "expr":
        return rng.choice(EXPRESSIONS)
    return rng.choice(EVIL_TARGETS)


# ==============================================================================================
# Worker: load, lower, run, compare
# ==============================================================================================


def _clone_tree(x):
    import torch
    import torch.utils._pytree as pytree

    return pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, x)


def _same_outputs(a, b) -> bool:
    import torch
    import torch.utils._pytree as pytree

    la, sa = pytree.tree_flatten(a)
    lb, sb = pytree.tree_flatten(b)
    if sa != sb or len(la) != len(lb):
        return False
    for x, y in zip(la, lb):
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
                return False
            if x.dtype != y.dtype or x.shape != y.shape or x.device != y.device:
                return False
            xb = x.detach().contiguous().reshape(-1).view(torch.uint8)
            yb = y.detach().contiguous().reshape(-1).view(torch.uint8)
            if not torch.equal(xb, yb):
                return False
        elif not (x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))):
            return False
    return True


def _strip_metadata(ep):
    """Drop node/graph metadata (stack traces, module stacks, custom) from a decoded schema tree."""
    from torch._export.serde import schema as S
    from torch._export.serde.union import _Union

    stack = [ep]
    while stack:
        obj = stack.pop()
        if isinstance(obj, (S.Node, S.GraphModule)):
            obj.metadata = {}
        if isinstance(obj, _Union):
            stack.append(obj.value)
        elif dataclasses.is_dataclass(obj):
            stack.extend(getattr(obj, f.name) for f in dataclasses.fields(obj))
        elif isinstance(obj, list):
            stack.extend(obj)
        elif isinstance(obj, dict):
            stack.extend(obj.values())
    return ep


def _fingerprint(path):
    """(schema tree without metadata, tensor records, segments [(bytes, checksum)]) of an artifact."""
    from exporter.serialize import reader

    art = reader.open_artifact(path)
    try:
        ep = _strip_metadata(reader.decode_graph(art))
        records = tuple(
            (reader.text(r.name), int(r.kind), int(r.dtype), tuple(int(x) for x in (r.sizes if r.sizes is not None else [])),
             tuple(int(x) for x in (r.strides if r.strides is not None else [])), int(r.storageOffset), int(r.segment),
             bool(r.requiresGrad))
            for r in art.program.tensors or [])
        segs = []
        for seg in art.program.segments or []:
            off = art.header.data_offset + int(seg.offset)
            segs.append((bytes(art.mm[off:off + int(seg.nbytes)]), int(seg.checksum)))
        return ep, records, segs
    finally:
        try:
            art.mm.close()
        except BufferError:
            pass


class Reference:
    """A seed's example inputs and outputs (eager and per preset) and fingerprint, in the worker."""

    def __init__(self, name: str, path: str):
        from exporter import load
        from exporter.api import load_for_backend
        from exporter.corpus.zoo import make_case
        from runtime_ref import Runtime

        case = make_case(name)
        self.args, self.kwargs = case.args, case.kwargs or {}
        self.eager = load(path)(*_clone_tree(self.args), **_clone_tree(self.kwargs))
        self.rt = {p: Runtime(load_for_backend(path, p, cache=False))(*_clone_tree(self.args), **_clone_tree(self.kwargs))
                   for p in PRESETS}
        self.fp = _fingerprint(path)

    def changed(self, path, verify: bool):
        """(changed?, note); note names weight damage that verify=True should have refused."""
        ep, records, segs = _fingerprint(path)
        if verify:
            for i, (b, crc) in enumerate(segs):
                if b and zlib.crc32(b) != crc:
                    return True, f"verify=True accepted weight segment {i} whose bytes fail its CRC"
        ref_ep, ref_records, ref_segs = self.fp
        try:
            same_graph = ep == ref_ep
        except Exception:
            same_graph = False
        same = same_graph and records == ref_records and [b for b, _ in segs] == [b for b, _ in ref_segs]
        return (not same), ""


class CodeExecution(BaseException):
    """Raised by the canary: text from the artifact ran as Python code."""


_CANARY_HITS: list[str] = []


def _install_canary() -> None:
    """builtins.PT2B_FUZZ_CANARY records a hit and raises; an audit hook records process spawns."""
    import builtins

    def canary(*_a, **_k):
        _CANARY_HITS.append("canary called")
        raise CodeExecution("PT2B_FUZZ_CANARY was called: text from the artifact ran as Python code")

    setattr(builtins, CANARY, canary)

    def hook(event, args):
        if event in ("os.system", "subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn", "os.fork"):
            _CANARY_HITS.append(f"audit event {event}")

    sys.addaudithook(hook)


_MEMORY_MESSAGES = ("can't allocate memory", "bad_alloc", "out of memory", "cannot allocate memory")


def _classify(e: BaseException, phase: str, changed: bool | None) -> str:
    from exporter.errors import ArtifactError, LoweringError, RuntimeInputError

    if isinstance(e, ArtifactError):
        return f"artifact_error:{type(e).__name__}"
    if isinstance(e, MemoryError) or (isinstance(e, RuntimeError) and any(m in str(e).lower() for m in _MEMORY_MESSAGES)):
        return "memory"
    if isinstance(e, CodeExecution):
        return "other:CodeExecution"
    if phase == "load" or changed is not True:
        return f"other:{type(e).__name__}"
    if isinstance(e, (LoweringError, RuntimeInputError)):
        return f"lowering_error:{type(e).__name__}"
    if isinstance(e, AssertionError) and str(e).startswith("Guard failed"):
        return "run_error:InputGuardFailed"  # ep.module()'s check of inputs against the recorded shapes
    if isinstance(e, TOLERATED_RUN_ERRORS) and not isinstance(e, RecursionError):
        return f"run_error:{type(e).__name__}"
    return f"other:{type(e).__name__}"


def execute(path: str, mutant: Mutant, ref: Reference, on_phase=lambda phase, changed: None) -> dict:
    """Load, run eagerly, lower and run with runtime_ref; the outcome of one mutant."""
    from exporter import load
    from exporter.api import load_for_backend
    from runtime_ref import Runtime

    res = {"outcome": "ok_equal", "changed": None, "phase": None, "detail": "", "traceback": ""}

    def fail(e, phase):
        outcome = "other:CodeExecution" if _CANARY_HITS else _classify(e, phase, res["changed"])
        res.update(outcome=outcome, phase=phase,
                   detail=f"{type(e).__name__}: {str(e)[:500]}",
                   traceback="".join(traceback.format_exception(type(e), e, e.__traceback__))[-6000:])
        return res

    phase = "load"
    on_phase(phase, res["changed"])
    _CANARY_HITS.clear()
    try:
        prog = load(path, verify=mutant.verify)
    except (Exception, SystemExit, CodeExecution) as e:
        return fail(e, phase)
    if _CANARY_HITS:
        res.update(outcome="other:CodeExecution", phase=phase, detail=f"code from the artifact ran: {_CANARY_HITS}")
        return res
    phase = "fingerprint"
    on_phase(phase, res["changed"])
    try:
        changed, note = ref.changed(path, mutant.verify)
    except (Exception, SystemExit, CodeExecution) as e:  # it loaded, so its program decodes: a failure is a finding
        return fail(e, phase)
    res["changed"] = changed
    if note:
        res.update(outcome="other:VerifyMissedDamage", phase="load", detail=note)
        return res
    events = []  # (outcome, phase, detail, tb)
    try:
        phase = "eager"
        on_phase(phase, res["changed"])
        out = prog(*_clone_tree(ref.args), **_clone_tree(ref.kwargs))
        if not _same_outputs(out, ref.eager):
            events.append(("mismatch", phase, "eager outputs differ from the seed's", ""))
    except (Exception, SystemExit, CodeExecution) as e:
        fail(e, phase)
        events.append((res["outcome"], phase, res["detail"], res["traceback"]))
    del prog
    try:
        phase = "load_for_backend"
        on_phase(phase, res["changed"])
        lowered = load_for_backend(path, mutant.preset, verify=mutant.verify, cache=False)
        phase = "runtime"
        on_phase(phase, res["changed"])
        rt = Runtime(lowered)
        phase = "run"
        on_phase(phase, res["changed"])
        out = rt(*_clone_tree(ref.args), **_clone_tree(ref.kwargs))
        if not _same_outputs(out, ref.rt[mutant.preset]):
            events.append(("mismatch", phase, f"runtime_ref outputs (preset {mutant.preset}) differ from the seed's", ""))
    except (Exception, SystemExit, CodeExecution) as e:
        fail(e, phase)
        events.append((res["outcome"], phase, res["detail"], res["traceback"]))
    if _CANARY_HITS and not any(ev[0] == "other:CodeExecution" for ev in events):
        events.insert(0, ("other:CodeExecution", phase, f"code from the artifact ran: {_CANARY_HITS}", ""))
    if not events:
        res.update(outcome="ok_equal", phase=None, detail="", traceback="")
        return res
    bad = [ev for ev in events if not allowed(ev[0], changed, ev[1])]
    outcome, phase, detail, tb = (bad or events)[0]
    res.update(outcome=outcome, phase=phase, detail=detail, traceback=tb)
    return res


def _worker_main(conn, cfg: dict) -> None:
    """Child process: build references, then answer ("run", seed, index) messages."""
    import resource

    log = cfg.get("log")
    fd = os.open(log if log else os.devnull, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if cfg.get("mem_bytes"):
        resource.setrlimit(resource.RLIMIT_AS, (cfg["mem_bytes"], cfg["mem_bytes"]))
    import logging
    import warnings

    warnings.simplefilter("ignore")
    import torch

    torch.set_num_threads(cfg.get("threads", 1))
    logging.disable(logging.WARNING)
    seeds = {n: open(p, "rb").read() for n, p in cfg["seeds"].items()}
    mutator = Mutator(seeds)
    _install_canary()
    refs = {n: Reference(n, p) for n, p in cfg["seeds"].items()}
    tmp = tempfile.mkdtemp(prefix="worker-", dir=cfg.get("tmp"))
    conn.send(("ready", os.getpid()))
    try:
        while True:
            msg = conn.recv()
            if msg is None:
                break
            _, seed, index = msg
            t0 = time.perf_counter()
            try:
                m = mutator.mutant(seed, index)
            except Exception as e:
                conn.send(("done", {"seed": seed, "index": index, "outcome": "fuzzer_error", "kind": "?", "model": "?", "desc": "",
                                    "verify": None, "preset": None, "changed": None, "phase": "generate",
                                    "detail": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-6000:]}))
                continue
            meta = {"seed": seed, "index": index, "kind": m.kind, "model": m.model, "desc": m.desc, "verify": m.verify,
                    "preset": m.preset}
            conn.send(("start", meta))
            path = os.path.join(tmp, f"m{index}.pt2b")
            with open(path, "wb") as f:
                f.write(m.data)
            try:
                res = execute(path, m, refs[m.model], lambda p, c: conn.send(("phase", (p, c))))
            finally:
                os.unlink(path)
            res.update(meta)
            res["seconds"] = time.perf_counter() - t0
            conn.send(("done", res))
    finally:
        for f in os.listdir(tmp):
            os.unlink(os.path.join(tmp, f))
        os.rmdir(tmp)


# ==============================================================================================
# Parent: a pool of workers with time limits
# ==============================================================================================


class _Worker:
    def __init__(self, ctx, cfg):
        self.parent, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, cfg), daemon=True)
        self.proc.start()
        child.close()
        self.ready = False
        self.started = time.monotonic()
        self.job = None  # [index, meta, phase, deadline, changed]

    def kill(self):
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)
        self.parent.close()


@dataclasses.dataclass
class Campaign:
    seed: int
    models: tuple
    totals: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    by_kind: dict = dataclasses.field(default_factory=lambda: collections.defaultdict(collections.Counter))
    findings: list = dataclasses.field(default_factory=list)  # result dicts of disallowed outcomes
    results: list = dataclasses.field(default_factory=list)  # every result (keep_results=True)
    done: int = 0
    seconds: float = 0.0
    restarts: int = 0

    def record(self, res: dict, keep: bool) -> None:
        res["allowed"] = allowed(res["outcome"], res.get("changed"), res.get("phase"))
        key = _total_key(res)
        self.totals[key] += 1
        self.by_kind[res.get("kind", "?")]["allowed" if res["allowed"] else "FINDING"] += 1
        self.done += 1
        if not res["allowed"]:
            models = "" if tuple(self.models) == DEFAULT_MODELS else f" --models {','.join(self.models)}"
            res["replay"] = f"python tools/fuzz_artifacts.py --replay {res['seed']}:{res['index']}{models} --run"
            self.findings.append(res)
        if keep:
            self.results.append(res)

    def distinct_findings(self) -> dict[str, list]:
        groups = collections.defaultdict(list)
        for r in sorted(self.findings, key=lambda r: r["index"]):
            groups[finding_signature(r)].append(r)
        return dict(groups)

    def summary(self) -> dict:
        return {
            "seed": self.seed, "models": list(self.models), "mutants": self.done, "seconds": round(self.seconds, 1),
            "mutants_per_second": round(self.done / self.seconds, 2) if self.seconds else None,
            "worker_restarts": self.restarts,
            "totals": dict(sorted(self.totals.items(), key=lambda kv: -kv[1])),
            "by_kind": {k: dict(v) for k, v in sorted(self.by_kind.items())},
            "distinct_findings": [
                {"signature": sig, "count": len(rs), "example": {k: v for k, v in rs[0].items() if k != "allowed"},
                 "indices": [r["index"] for r in rs[:50]]}
                for sig, rs in self.distinct_findings().items()
            ],
        }


def _total_key(res: dict) -> str:
    o = res["outcome"]
    if o in ("mismatch", "memory") or o.startswith(("lowering_error:", "run_error:", "other:")):
        o += " [changed program]" if res.get("changed") else (" [same program]" if res.get("changed") is False else "")
    return o


def finding_signature(res: dict) -> str:
    """Outcome + phase + the exception message with numbers, quotes and paths blurred."""
    detail = (res.get("detail") or "").splitlines()[0] if res.get("detail") else ""
    detail = re.sub(r"/[^\s:,'\"]+", "<path>", detail)
    detail = re.sub(r"'[^']*'|\"[^\"]*\"", "<s>", detail)
    detail = re.sub(r"(?<![A-Za-z_])\d+", "N", detail)[:160]
    return f"{res['outcome']} @ {res.get('phase')} | {detail}"


def run_campaign(seed: int, mutants: int, *, workers: int = 2, models=DEFAULT_MODELS, seeds_dir: str | None = None,
                 timeout: float = 20.0, mem_gib: float = 6.0, time_budget: float | None = None, start: int = 0,
                 indices=None, keep_results: bool = False, progress=None, log: str | None = None,
                 threads: int = 1) -> Campaign:
    """Run mutants ``start .. start+mutants-1`` (or the given ``indices``: ints, or (seed, index)
    pairs) of ``seed`` on ``workers`` worker processes. ``time_budget`` (seconds) stops dispatching new mutants once spent."""
    import multiprocessing as mp
    from multiprocessing.connection import wait

    own_dir = None
    if seeds_dir is None:
        own_dir = seeds_dir = tempfile.mkdtemp(prefix="pt2b-fuzz-seeds-")
    seed_paths = export_seeds(models, seeds_dir)
    work = tempfile.mkdtemp(prefix="pt2b-fuzz-run-")  # workers' mutant files; removed even if one was killed
    cfg = {"seeds": seed_paths, "mem_bytes": int(mem_gib * 2**30) if mem_gib else 0, "log": log, "threads": threads,
           "tmp": work}
    todo = [x if isinstance(x, tuple) else (seed, x)
            for x in (indices if indices is not None else range(start, start + mutants))]
    todo.reverse()
    camp = Campaign(seed, tuple(models))
    ctx = mp.get_context("spawn")
    pool = [_Worker(ctx, cfg) for _ in range(max(1, min(workers, len(todo) or 1)))]
    t0 = time.monotonic()
    last_progress = t0
    spawn_limit = 600.0

    def restart(i):
        pool[i].kill()
        pool[i] = _Worker(ctx, cfg)
        camp.restarts += 1

    def give(w):
        if not todo or (time_budget is not None and time.monotonic() - t0 > time_budget):
            w.job = None
            return
        job_seed, index = todo.pop()
        w.job = [index, {"seed": job_seed, "index": index}, "generate", time.monotonic() + timeout, None]
        w.parent.send(("run", job_seed, index))

    try:
        while True:
            busy = [w for w in pool if w.job is not None or not w.ready]
            if not busy:
                break
            now = time.monotonic()
            deadlines = [w.job[3] if w.job else w.started + spawn_limit for w in busy]
            ready = wait([w.parent for w in busy] + [w.proc.sentinel for w in busy],
                         timeout=max(0.0, min(deadlines) - now))
            for i, w in enumerate(pool):
                if w not in busy:
                    continue
                dead = False
                try:
                    while w.parent in ready and w.parent.poll():
                        kind, payload = w.parent.recv()
                        if kind == "ready":
                            w.ready = True
                            give(w)
                        elif kind == "start":
                            w.job[1] = payload
                        elif kind == "phase":
                            w.job[2], w.job[4] = payload
                        elif kind == "done":
                            camp.record(payload, keep_results)
                            give(w)
                except (EOFError, OSError):
                    dead = True
                if dead or (not w.proc.is_alive()):
                    w.proc.join(1)
                    code = w.proc.exitcode
                    if w.job is not None:
                        index, meta, phase, _, changed = w.job
                        outcome = "memory" if code == -9 else "crash"
                        res = dict(meta, index=index, outcome=outcome, changed=changed, phase=phase,
                                   detail=f"worker died with exit code {code} during {phase}", traceback="")
                        camp.record(res, keep_results)
                        restart(i)
                    elif not w.ready:
                        raise RuntimeError(f"fuzz worker failed to start (exit code {code}); set log= to see why")
                    else:
                        restart(i)
                    continue
                if w.job is not None and time.monotonic() > w.job[3]:
                    index, meta, phase, _, changed = w.job
                    res = dict(meta, index=index, outcome="timeout", changed=changed, phase=phase,
                               detail=f"no result within {timeout:g} s (phase {phase})", traceback="")
                    camp.record(res, keep_results)
                    restart(i)
                elif not w.ready and time.monotonic() > w.started + spawn_limit:
                    raise RuntimeError("fuzz worker did not start in time")
            if progress and time.monotonic() - last_progress > 30:
                last_progress = time.monotonic()
                progress(camp, time.monotonic() - t0)
    finally:
        for w in pool:
            try:
                w.parent.send(None)
            except (OSError, BrokenPipeError):
                pass
        for w in pool:
            w.proc.join(2)
            w.kill()
        camp.seconds = time.monotonic() - t0
        shutil.rmtree(work, ignore_errors=True)
        if own_dir:
            shutil.rmtree(own_dir, ignore_errors=True)
    return camp


# ==============================================================================================
# CLI
# ==============================================================================================


def _print_report(camp: Campaign, out=sys.stdout) -> None:
    s = camp.summary()
    p = lambda *a: print(*a, file=out)  # noqa: E731
    p(f"seed {camp.seed}: {camp.done} mutants of {', '.join(camp.models)} in {camp.seconds:.0f} s "
      f"({s['mutants_per_second']} mutants/s), {camp.restarts} worker restarts")
    p("totals by outcome class:")
    for k, n in s["totals"].items():
        flag = "" if allowed(k.split(" [")[0], True if "[changed" in k else (False if "[same" in k else None),
                             "run") or k.startswith(("ok_equal", "artifact_error")) else "   <-- NOT ALLOWED"
        p(f"  {n:8d}  {k}{flag}")
    p("by mutation kind (allowed / findings):")
    for k, c in s["by_kind"].items():
        p(f"  {k:20s} {c.get('allowed', 0):8d} / {c.get('FINDING', 0)}")
    groups = camp.distinct_findings()
    p(f"findings: {len(camp.findings)} ({len(groups)} distinct)")
    for sig, rs in groups.items():
        r = rs[0]
        p(f"- [{len(rs)}x] {sig}")
        p(f"    first: seed {r['seed']} mutant {r['index']} ({r.get('model')}, {r.get('kind')}: {r.get('desc')}; "
          f"verify={r.get('verify')}, preset={r.get('preset')})")
        p(f"    replay: {r['replay']}")


def _replay(spec: str, models, out_path: str | None, run: bool, seeds_dir: str | None, timeout: float,
            mem_gib: float) -> int:
    seed, _, index = spec.partition(":")
    seed, index = int(seed), int(index)
    own = seeds_dir is None
    seeds_dir = seeds_dir or tempfile.mkdtemp(prefix="pt2b-fuzz-seeds-")
    paths = export_seeds(models, seeds_dir)
    mutator = Mutator({n: open(p, "rb").read() for n, p in paths.items()})
    m = mutator.mutant(seed, index)
    out_path = out_path or f"fuzz_{seed}_{index}.pt2b"
    with open(out_path, "wb") as f:
        f.write(m.data)
    print(f"seed {seed} mutant {index}: {m.model}, {m.kind}: {m.desc}")
    print(f"  verify={m.verify} preset={m.preset}; {len(m.data)} bytes written to {out_path}")
    print(f"  reproduce by hand: load({out_path!r}, verify={m.verify}) then "
          f"Runtime(load_for_backend({out_path!r}, {m.preset!r}, verify={m.verify}))(*make_case({m.model!r}).args)")
    rc = 0
    if run:
        camp = run_campaign(seed, 0, indices=[index], workers=1, models=models, seeds_dir=seeds_dir,
                            timeout=timeout, mem_gib=mem_gib, keep_results=True)
        r = camp.results[0]
        print(f"  outcome: {r['outcome']} (phase {r.get('phase')}, changed={r.get('changed')}) -> "
              f"{'allowed' if r['allowed'] else 'NOT ALLOWED'}")
        if r.get("detail"):
            print(f"  detail: {r['detail']}")
        if r.get("traceback"):
            print(r["traceback"])
        rc = 0 if r["allowed"] else 1
    if own:
        for f in os.listdir(seeds_dir):
            os.unlink(os.path.join(seeds_dir, f))
        os.rmdir(seeds_dir)
    return rc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mutants", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--start", type=int, default=0, help="first mutant index")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated zoo cases")
    ap.add_argument("--seeds-dir", help="where seed artifacts are (re)used; default: a temporary folder")
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds per mutant")
    ap.add_argument("--mem-gib", type=float, default=6.0, help="RLIMIT_AS of each worker")
    ap.add_argument("--time-budget", type=float, help="stop dispatching after this many seconds")
    ap.add_argument("--json", help="write totals and findings here")
    ap.add_argument("--log", help="worker stdout/stderr go here (default: discarded)")
    ap.add_argument("--replay", metavar="SEED:INDEX", help="save that mutant (see --out) and describe it")
    ap.add_argument("--out", help="with --replay: file to write (default fuzz_SEED_INDEX.pt2b)")
    ap.add_argument("--run", action="store_true", help="with --replay: also run it in a worker, print the traceback")
    a = ap.parse_args(argv)
    models = tuple(m for m in a.models.split(",") if m)
    if a.replay:
        return _replay(a.replay, models, a.out, a.run, a.seeds_dir, a.timeout, a.mem_gib)

    def progress(camp, elapsed):
        bad = len(camp.findings)
        print(f"[{elapsed:6.0f} s] {camp.done} mutants, {camp.done / elapsed:.1f}/s, {bad} findings",
              file=sys.stderr, flush=True)

    camp = run_campaign(a.seed, a.mutants, workers=a.workers, models=models, seeds_dir=a.seeds_dir,
                        timeout=a.timeout, mem_gib=a.mem_gib, time_budget=a.time_budget, start=a.start,
                        progress=progress, log=a.log)
    _print_report(camp)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(camp.summary(), f, indent=1, default=str)
    return 1 if camp.findings else 0


if __name__ == "__main__":
    sys.exit(main())
