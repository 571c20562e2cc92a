"""The mutations: mutant ``index`` of seed ``seed`` (``Mutator.mutant``), drawn from its own random
stream so that it depends only on (seed, index) and the seed artifacts.

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
    export schema tree (schema_tree.graph_of): node targets, symbolic expressions, names, ints,
    enums, lists, union members; or one name renamed consistently everywhere, tensor records
    included). Names are also set to code-injection payloads that call a canary (``CANARY``).
    struct_guards (GUARDS_SHARE of the struct_schema draws, from their own random stream so the
    other mutants stay as they were): guards_code, which ep.module() exec()s, extended with
    torch-like guards, guards over unknown arguments, huge powers and canary payloads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import re
import struct
import zlib

from .layout import HEADER_FIELDS, HEADER_FMT, fix_header_crc, region, with_program
from .schema_tree import set_graph
from .seeds import Seed
from .slots import fb_slots, schema_slots
from .values import CANARY, DELETE, EXPRESSIONS, INJECTIONS, INT_SPECIALS, NAME_PATH, Retry, mutate_value

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
GUARDS_SALT = 0x6A4D_0000_0002  # chosen so that no FIXED regression mutant in tests/untrusted/test_fuzz.py moves


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
        return f"python -m tools.fuzz --replay {self.seed}:{self.index} --run"


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
            except Retry:
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
        return buf, f"flip bits {','.join(flips)} ({region(s, int(flips[0].split(':')[0]))})"

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
        return buf, f"overwrite {n} bytes at {p} with {fill} ({region(s, p)})"

    def _m_truncate_boundary(self, rng, s):
        label, b = rng.choice(s.boundaries)
        delta = rng.choice((0, 0, 0, -1, 1, -4, 4, -8, 8))
        n = max(0, min(len(s.data) - 1, b + delta))
        return s.data[:n], f"truncate to {n} bytes ({label} {delta:+d})"

    def _m_truncate_random(self, rng, s):
        n = rng.randrange(len(s.data))
        return s.data[:n], f"truncate to {n} bytes ({region(s, n)})"

    def _m_extend(self, rng, s):
        extra = _fill_bytes(rng, rng.choice(("random", "zero")), rng.choice((1, 7, 64, 4096)))
        if rng.random() < 0.5:
            return s.data + extra, f"append {len(extra)} bytes"
        p = rng.randrange(len(s.data))
        return s.data[:p] + extra + s.data[p:], f"insert {len(extra)} bytes at {p} ({region(s, p)})"

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
            fix_header_crc(out)
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
        fix_header_crc(out)
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
        fix_header_crc(buf)
        return buf, f"header {name} {cur} -> {v}, header CRC repaired"

    def _m_repaired_header(self, rng, s):
        buf = bytearray(s.data)
        flips = []
        for _ in range(rng.choice((1, 1, 2, 4))):
            p = rng.choice([i for i in range(64) if not 52 <= i < 56])
            bit = rng.randrange(8)
            buf[p] ^= 1 << bit
            flips.append(f"{p}:{bit}")
        fix_header_crc(buf)
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
        return with_program(s, bytes(prog)), desc + ", CRCs repaired"

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
        return with_program(s, bytes(prog)), f"program u32 at {p}: {cur} -> {v}, CRCs repaired"

    def _m_struct_fb(self, rng, s):
        tree = s.program_tree()
        if rng.random() < 0.04:
            return _pack(s, tree), "re-pack the program unchanged (identity), CRCs repaired"
        slots = fb_slots(tree)
        r = rng.random()
        if r < 0.08:
            names = [x for x in slots if x[3].endswith(".name") and x[3].startswith("program.tensors")]
            slots = names or slots
        elif r < 0.38:  # the program table outside the graph: tensors, segments, operators...
            top = [x for x in slots if not x[3].startswith("program.exportedProgram")]
            slots = top or slots
        parent, key, value, path = rng.choice(slots)
        new, what = mutate_value(rng, value, s.strings, path, tree_objs=slots)
        if isinstance(parent, list):
            parent[key] = new
        elif new is DELETE:
            setattr(parent, key, None)
        else:
            setattr(parent, key, new)
        if new is DELETE and isinstance(parent, list):
            raise Retry
        return _pack(s, tree), f"program table {path}: {what}, CRCs repaired"

    def _m_struct_guards(self, rng, s):
        """Set the program's guards_code (which ep.module() exec()s) to torch-like guards, guards over
        unknown arguments, huge powers or canary payloads."""
        tree = s.program_tree()
        ep = s.schema_tree(tree)
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
        set_graph(tree, ep)
        return _pack(s, tree), f"guards_code += {[g[:80] for g in new]!r}, CRCs repaired"

    def _m_struct_schema(self, rng, s):
        from exporter.errors import ExportError

        tree = s.program_tree()
        ep = s.schema_tree(tree)
        slots = schema_slots(ep)
        r = rng.random()
        targets = [x for x in slots if x[3].endswith(".target") and isinstance(x[2], str)]
        exprs = [x for x in slots if x[3].endswith(".expr_str")
                 or (x[3].startswith("ep.range_constraints") and x[3].endswith("<key>"))]
        names = [x for x in slots if isinstance(x[2], str) and re.search(NAME_PATH, x[3])]
        if 0.52 <= r < 0.64:  # rename one name everywhere (schema tree and tensor records) consistently
            old = rng.choice(sorted({x[2] for x in names} | {_text(t.name) for t in tree.tensors or []}))
            if "." in old and rng.random() < 0.3:  # a dotted attribute path: break out of getattr(self, "...")
                head = old.split(".")[0]
                new = f'{head}")+{CANARY}()+getattr(self,"{old}'
            else:
                new, _ = mutate_value(rng, old, s.strings, ".name")
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
                set_graph(tree, ep)
            except (ExportError, TypeError, ValueError, AttributeError, KeyError, AssertionError, OverflowError):
                raise Retry from None
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
            new, what = mutate_value(rng, old, s.strings, path)
            if not isinstance(new, str):
                raise Retry
            d = parent
            items = [(new if k == old else k, v) for k, v in d.items()]
            d.clear()
            d.update(items)
        else:
            new, what = mutate_value(rng, value, s.strings, path, tree_objs=slots)
            if new is DELETE:
                new = None
            if isinstance(parent, (list, dict)):
                parent[key] = new
            else:
                setattr(parent, key, new)
        try:
            set_graph(tree, ep)
        except (ExportError, TypeError, ValueError, AttributeError, KeyError, AssertionError, OverflowError):
            raise Retry from None
        return _pack(s, tree), f"schema {path}: {what}, CRCs repaired"


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


def _pack(s: Seed, tree) -> bytearray:
    import flatbuffers

    from exporter.layout.container import FILE_IDENTIFIER

    try:
        b = flatbuffers.Builder(1 << 16)
        b.Finish(tree.Pack(b), file_identifier=FILE_IDENTIFIER)
    except Exception:  # an int out of its field's range, a str where a table goes...
        raise Retry from None
    return with_program(s, bytes(b.Output()))
