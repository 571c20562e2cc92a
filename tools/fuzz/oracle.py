"""The oracle: what one mutant does when loaded, lowered and run, and whether that is allowed.

Execution: a batch process (worker.py; torch's state built once, RLIMIT_AS set) takes one mutant at a
time: ``load(path, verify=v)`` (v random per mutant), runs the loaded program eagerly on the seed's
example inputs, then ``Runtime(load_for_backend(path, preset, verify=v))`` (preset "none" or
"core") and compares both with the seed's own outputs (bitwise); for a multi-method seed
("<case>_methods") every method, in order, eagerly and on ``runtime_ref.runtimes`` over one state. The sweep
runner kills a batch whose mutant exceeds the per-mutant limit (``timeout``); a batch that died is that
mutant's ``crash``; the campaign runs the rest of the batch anew.

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
  crash                      the worker died (a non-zero exit)                             never
  signal:<NAME>              the worker was killed by a signal (SIGSEGV, SIGABRT...;       never
                             SIGKILL, the kernel's out-of-memory killer, is memory)
  state_change               torch's process-global state (observe.py: grad mode,          never
                             autocast, default dtype...) differs after the mutant
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

import dataclasses
import hashlib
import math
import sys
import traceback
import zlib
from typing import TYPE_CHECKING

from .values import CANARY

if TYPE_CHECKING:
    from .mutators import Mutant

PRESETS = ("none", "core")

# What torch raises when a kernel, a fake-tensor propagation or a decomposition rejects a program
# that is well formed but inconsistent (a crafted size, a swapped argument): tolerated after a good
# load of a changed program. Internal-invariant errors (AssertionError, AttributeError, KeyError,
# RecursionError...) are not: load() should have refused the program with an ArtifactError.
TOLERATED_RUN_ERRORS = (RuntimeError, ValueError, IndexError, TypeError, ZeroDivisionError, OverflowError,
                        NotImplementedError)

EXEC_PHASES = ("fingerprint", "eager", "load_for_backend", "runtime", "run")  # after a good load
GRAPH_PHASES = ("eager", "run")  # torch executing the program's own graph


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
    """(schema tree without metadata, tensor records, segments [(bytes, checksum)]) of an artifact; a
    segment's checksum is its recorded sha256 digest where the file records digests, else its CRC32."""
    from exporter.serialize import reader

    art = reader.open_artifact(path)
    try:
        methods = [reader.method(art, name) for name in art.method_names]
        ep = [(m.method, _strip_metadata(reader.decode_graph(m))) for m in methods]
        records = tuple(
            (m.method, reader.text(r.name), int(r.kind), int(r.dtype),
             tuple(int(x) for x in (r.sizes if r.sizes is not None else [])),
             tuple(int(x) for x in (r.strides if r.strides is not None else [])), int(r.storageOffset), int(r.segment),
             bool(r.requiresGrad))
            for m in methods for r in m.program.tensors or [])
        segs = []
        digests = reader.weight_digests(art)
        for i, seg in enumerate(art.program.segments or []):
            off = art.header.data_offset + int(seg.offset)
            segs.append((bytes(art.mm[off:off + int(seg.nbytes)]), digests[i] if digests else int(seg.checksum)))
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

        from .seeds import seed_case

        case, self.methods = seed_case(name)
        self.args, self.kwargs = case.args, case.kwargs or {}
        self.eager = self.run_all(load(path))
        self.rt = {p: self.run_all(load_for_backend(path, p, cache=False), runtime=True) for p in PRESETS}
        self.fp = _fingerprint(path)

    def run_all(self, prog, runtime: bool = False) -> list:
        """Every method of the seed on its inputs, in order (runtime: on runtime_ref, over one state);
        a program that lacks one of the seed's methods raises MethodNotFoundError."""
        from runtime_ref import runtimes

        call = runtimes(prog) if runtime else prog.methods
        missing = [m for m in self.methods if m not in call]
        if missing:
            prog[missing[0]]  # raises MethodNotFoundError
        return [call[m](*_clone_tree(self.args), **_clone_tree(self.kwargs)) for m in self.methods]

    def changed(self, path, verify: bool):
        """(changed?, note); note names weight damage that verify=True should have refused."""
        ep, records, segs = _fingerprint(path)
        if verify:
            for i, (b, recorded) in enumerate(segs):
                if isinstance(recorded, bytes) and hashlib.sha256(b).digest() != recorded:
                    return True, f"verify=True accepted weight segment {i} whose bytes fail its sha256 digest"
                if isinstance(recorded, int) and b and zlib.crc32(b) != recorded:
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


def install_canary() -> None:
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
    from runtime_ref import runtimes

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
        out = ref.run_all(prog)
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
        rts = runtimes(lowered)
        missing = [m for m in ref.methods if m not in rts]
        if missing:
            lowered[missing[0]]  # raises MethodNotFoundError
        phase = "run"
        on_phase(phase, res["changed"])
        out = [rts[m](*_clone_tree(ref.args), **_clone_tree(ref.kwargs)) for m in ref.methods]
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
