"""Operator-schema drift on load: each op schema recorded in an artifact is compared (parsed, never as
text) with the running torch's (``compare`` has the rules), and the program's nodes are upgraded or one
error lists every irreconcilable op. ``reconcile`` also serves retarget.py, with a stored registry
standing for the running torch. Why: docs/format.md#op-schemas, docs/releases.md#op-schemas-across-releases-both-ways."""

from __future__ import annotations

import dataclasses
import functools
import keyword
import re

import torch

from .._torch.serde import schema as S
from ..errors import CorruptArtifactError, MissingOperatorError, SchemaDriftError
from ..graph_walk import iter_serialized_graphs
from ..layout.generated import pt2b_generated as G
from ..util import nesting
from . import op_table, upgraders

MAX_CHAIN = 16
MAX_SCHEMA_LEN = 1 << 16
# torch's schema parser, and every walk of the types it builds, recurse in C++ without a limit on
# nested brackets and on list/optional marks in a row ("int[][]?"): thousands of levels overflow the
# stack and kill the process. Both caps leave torch's own schemas far below them (a test checks every
# schema of the running torch).
MAX_SCHEMA_DEPTH = 16
MAX_TYPE_MARKS = 8
_QUOTES = "\"'"
# refused so that the bracket scan reads string literals as torch's lexer does (torch's own schemas
# hold none): a comment, a line break or other control character, a triple-quoted string
_UNLEXED = re.compile(r"#|\"\"\"|'''|[\x00-\x1f\x7f]")
_MARKS = re.compile(r"[\[\]?\d\s]+")
# the shape of an op-table record (operator names are identifiers, "__and__" included); whether it
# names an operator is asked of torch's registry (exporter/ops.py), never read from the spelling
_NAME = re.compile(r"[A-Za-z_]\w{0,1023}", re.ASCII)
_QUALIFIED = re.compile(r"[A-Za-z_]\w{0,1023}::[A-Za-z_]\w{0,1023}", re.ASCII)
_NO_DEFAULT = object()


# ---- parsing and comparison ----
def nesting_problem(schema: str) -> str | None:
    """Why torch's schema parser must not see ``schema`` (MAX_SCHEMA_LEN, _UNLEXED, MAX_SCHEMA_DEPTH,
    MAX_TYPE_MARKS), or None; in time linear in its length."""
    if len(schema) > MAX_SCHEMA_LEN:
        return f"is {len(schema)} characters long, more than {MAX_SCHEMA_LEN}"
    if _UNLEXED.search(schema):
        return "holds a comment, a control character or a triple quote"
    depth = nesting.bracket_depth(schema, _QUOTES)
    if depth > MAX_SCHEMA_DEPTH:
        return f"nests brackets {depth} levels deep, more than {MAX_SCHEMA_DEPTH}"
    marks = type_marks(schema)
    if marks > MAX_TYPE_MARKS:
        return f"puts {marks} list or optional marks in a row, more than {MAX_TYPE_MARKS}"
    return None


def type_marks(schema: str) -> int:
    """The most list and optional marks (``[]``, ``[2]``, ``?``) in a row outside string literals, spaces
    between them included (torch's lexer skips those)."""
    return max((m.group().count("[") + m.group().count("?")
                for m in _MARKS.finditer(nesting.outside_literals(schema, _QUOTES))), default=0)


@functools.lru_cache(maxsize=4096)
def parse(schema: str):
    """torch._C.FunctionSchema of ``schema``; ValueError (with torch's reason, or nesting_problem's) if
    it does not parse or must not be parsed."""
    why = nesting_problem(schema)
    if why is not None:
        raise ValueError(f"the schema {why}")
    try:
        return torch._C.parse_schema(schema)
    except RuntimeError as e:
        first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "parse error")
        raise ValueError(first) from None
    except (IndexError, ValueError, OverflowError, TypeError) as e:
        # C++ exceptions pybind turns into these: std::out_of_range from stoll/stod on a default
        # value past int64 or double (IndexError), std::invalid_argument (ValueError)
        raise ValueError(f"a default value is out of range or malformed ({type(e).__name__}: {e})") from None


def _type(t) -> str:
    return str(t).replace("SymInt", "int")


def _spell(t) -> str:
    """A type as schemas spell it (int?, Scalar, Tensor[]), for messages."""
    kind = t.kind()
    if kind == "OptionalType":
        return _spell(t.getElementType()) + "?"
    if kind == "ListType":
        return _spell(t.getElementType()) + "[]"
    if kind == "NumberType":
        return "Scalar"
    return str(t)


def _alias(a):
    ai = a.alias_info
    return None if ai is None else (bool(ai.is_write), tuple(sorted(ai.before_set)), tuple(sorted(ai.after_set)))


def _default(a):
    return a.default_value if a.has_default_value() else _NO_DEFAULT


def _same_default(x, y) -> bool:
    if x is _NO_DEFAULT or y is _NO_DEFAULT:
        return x is y
    return type(x) is type(y) and x == y or (
        isinstance(x, (int, float)) and isinstance(y, (int, float)) and not isinstance(x, bool)
        and not isinstance(y, bool) and x == y)


def _ret_key(r) -> tuple:
    return (_type(r.real_type), _alias(r))


def _fmt_default(a) -> str:
    d = _default(a)
    return "" if d is _NO_DEFAULT else f"={d!r}"


def _fmt_arg(a) -> str:
    return f"{_spell(a.real_type)} {a.name}{_fmt_default(a)}"


def _fmt_returns(returns) -> str:
    return "(" + ", ".join(f"{_spell(r.real_type)}{' ' + r.name if r.name else ''}" for r in returns) + ")"


@dataclasses.dataclass
class Drift:
    kind: str                                              # "identical" | "compatible" | "breaking"
    added: list[str] = dataclasses.field(default_factory=list)    # compatible additions
    reasons: list[str] = dataclasses.field(default_factory=list)  # why it is breaking
    renamed_returns: list[str] = dataclasses.field(default_factory=list)
    # arguments (with defaults) that the old schema has and the new lacks: name -> default; a node
    # that passes one its default drops it (an artifact of a newer torch, downgraded)
    dropped: dict = dataclasses.field(default_factory=dict)

    def describe(self) -> str:
        parts = list(self.added) + [f"return renamed {r}" for r in self.renamed_returns] + [
            f"argument {n}={d!r} dropped where it holds its default" for n, d in self.dropped.items()]
        return ", ".join(parts) if self.kind == "compatible" else "; ".join(self.reasons)


def compare(old, new) -> Drift:
    """Classify the drift from parsed schema ``old`` (recorded) to ``new`` (running).

    Arguments are compared by name, type (SymInt spelled int), default value, keyword-only-ness and
    alias annotation; returns by type and alias (a return renamed is noted). Identical -> nothing.
    The new schema only ADDS arguments that have defaults (positional after every old positional
    one, or keyword-only) and returns the same -> compatible: the node is left as written (torch's
    deserializer omits missing defaulted inputs, which is what its own serializer writes). The
    mirror, an artifact of a NEWER torch whose schema has arguments with defaults that the running
    one lacks -> downgradable: a node that passes such an argument its default value (or omits it)
    drops it, a node that passes anything else is a SchemaDriftError naming the op, the argument and
    both releases. Anything else -> an upgrader (or downgrader) keyed by (op, overload, old schema)
    from upgraders.py, chained while its output schema still differs; none -> irreconcilable."""
    reasons, added, renamed, dropped = [], [], [], {}
    if (old.name, old.overload_name) != (new.name, new.overload_name):
        reasons.append(f"op {old.name}.{old.overload_name or 'default'} became "
                       f"{new.name}.{new.overload_name or 'default'}")
    old_pos = [a.name for a in old.arguments if not a.kwarg_only]
    new_pos = [a.name for a in new.arguments if not a.kwarg_only]
    new_by_name = {a.name: a for a in new.arguments}
    old_names = {a.name for a in old.arguments}
    for a in old.arguments:
        b = new_by_name.get(a.name)
        if b is None:
            if a.has_default_value() and (a.kwarg_only or all(n not in new_by_name for n in
                                                             old_pos[old_pos.index(a.name):])):
                dropped[a.name] = a.default_value  # trailing or keyword-only, with a default
            else:
                reasons.append(f"argument '{a.name}' ({_fmt_arg(a)}) is gone (removed or renamed)")
            continue
        if _type(a.real_type) != _type(b.real_type):
            reasons.append(f"argument '{a.name}' changed type {_spell(a.real_type)} -> {_spell(b.real_type)}")
        if not _same_default(_default(a), _default(b)):
            before = "no default" if _default(a) is _NO_DEFAULT else f"default {_default(a)!r}"
            after = "no default" if _default(b) is _NO_DEFAULT else f"default {_default(b)!r}"
            reasons.append(f"argument '{a.name}' changed {before} -> {after}")
        if bool(a.kwarg_only) != bool(b.kwarg_only):
            reasons.append(f"argument '{a.name}' became {'keyword-only' if b.kwarg_only else 'positional'}")
        elif not a.kwarg_only and old_pos.index(a.name) != new_pos.index(a.name):
            reasons.append(f"argument '{a.name}' moved from position {old_pos.index(a.name)} "
                           f"to {new_pos.index(a.name)}")
        if _alias(a) != _alias(b):
            reasons.append(f"argument '{a.name}' changed its alias annotation")
    for b in new.arguments:
        if b.name in old_names:
            continue
        if not b.has_default_value():
            reasons.append(f"argument '{b.name}' ({_fmt_arg(b)}) added without a default")
        else:
            added.append(f"added {'keyword' if b.kwarg_only else 'positional'} argument {b.name}{_fmt_default(b)}")
    if [_ret_key(r) for r in old.returns] != [_ret_key(r) for r in new.returns]:
        reasons.append(f"returns changed {_fmt_returns(old.returns)} -> {_fmt_returns(new.returns)}")
    else:
        renamed = [f"{r.name or '#%d' % i}->{s.name or '#%d' % i}"
                   for i, (r, s) in enumerate(zip(old.returns, new.returns)) if r.name != s.name]
    if reasons:
        return Drift("breaking", added, reasons)
    if added or renamed or dropped:
        return Drift("compatible", added, [], renamed, dropped)
    return Drift("identical")


def same_schema(old, new) -> bool:
    return compare(old, new).kind == "identical"


def find_upgrader(qualified_name: str, overload: str, recorded):
    """The registered upgrader whose old schema equals ``recorded`` (parsed), or None."""
    for up in upgraders.candidates(qualified_name, overload):
        if same_schema(parse(up.old_schema), recorded):
            return up
    return None


# ---- program walking ----
def op_target(qualified_name: str, overload: str) -> str:
    ns, _, name = qualified_name.partition("::")
    return f"torch.ops.{ns}.{name}.{overload or 'default'}"


def _node_problems(node: S.Node, schema) -> list[str]:
    """Inputs torch's deserializer would fail on (a required one missing) or silently drop
    (a name the schema does not have)."""
    names = {i.name for i in node.inputs}
    out = [f"node {node.name or '?'} lacks required input '{a.name}'" for a in schema.arguments
           if a.name not in names and not a.has_default_value()]
    known = {a.name for a in schema.arguments}
    out += [f"node {node.name or '?'} has input '{n}' that the schema does not have" for n in sorted(names - known)]
    out += [f"node {node.name or '?'} passes '{a.name}' (a Python keyword) by keyword" for a in schema.arguments
            if keyword.iskeyword(a.name) and any(i.name == a.name and i.kind == S.ArgumentKind.KEYWORD
                                                 for i in node.inputs)]
    return out


# ---- the driver ----
@dataclasses.dataclass
class _Plan:
    label: str
    target: str
    chain: list            # upgraders, applied in order
    final_target: str
    final_schema: object   # running torch's FunctionSchema
    note: str | None
    dropped: dict = dataclasses.field(default_factory=dict)  # argument -> default, dropped at its default


class Side:
    """The torch a program is reconciled with: the running one, or a stored registry of another
    release (``registry``: exporter.versioning.registries.Registry)."""

    def __init__(self, registry=None):
        self.registry = registry
        self.version = registry.torch_version if registry is not None else torch.__version__
        self.label = f"torch {self.version}" if registry is not None else f"this torch ({torch.__version__})"

    def schema(self, qname: str, overload: str):
        if self.registry is None:
            op = op_table.resolve(qname, overload)
            return op._schema if isinstance(op, torch._ops.OpOverload) else None
        text = self.registry.schema(qname, overload)
        return parse(text) if text is not None else None

    def schema_text(self, qname: str, overload: str) -> str | None:
        if self.registry is not None:
            return self.registry.schema(qname, overload)
        s = self.schema(qname, overload)
        return None if s is None else str(s)

    def overloads(self, qname: str) -> list[str]:
        if self.registry is not None:
            return self.registry.overloads(qname)
        return sorted(s.overload_name or "default" for s in torch._C._jit_get_schemas_for_operator(qname))

    def overloads_hint(self, qname: str) -> str:
        have = self.overloads(qname)
        if not have:
            return f"{self.label} has no op {qname}"
        return f"{self.label} has {qname} only with overloads: {', '.join(have)}"


RUNNING = Side()


def _plan_op(qname, overload, recorded_str, kind, where, side: Side = RUNNING):
    """(_Plan | None, problem line | None, missing?) for one op-table record."""
    overload = overload or "default"
    label = f"{qname}.{overload}"
    if not (_QUALIFIED.fullmatch(qname) and _NAME.fullmatch(overload)) or len(recorded_str) > MAX_SCHEMA_LEN:
        raise CorruptArtifactError(f"{where}: the op table holds a malformed record {label[:120]!r} "
                                   f"(schema of {len(recorded_str)} characters).")
    running = side.schema(qname, overload)
    if running is not None and recorded_str == side.schema_text(qname, overload):
        return None, None, False                               # the common case: same text
    if not recorded_str:                                       # no schema recorded: presence only
        if running is not None:
            return None, None, False
        return None, _missing_line(label, qname, "?", kind, side), True
    why = nesting_problem(recorded_str)
    if why is not None:
        raise CorruptArtifactError(f"{where}: the op table's schema of {label} {why}; pt2b never hands such text "
                                   f"to torch's schema parser, which recurses without a limit (the file is "
                                   f"damaged or crafted).")
    try:
        recorded = parse(recorded_str)
    except ValueError as e:
        if running is None:
            return None, _missing_line(label, qname, recorded_str, kind, side), True
        return None, (f"  {label}\n    recorded: {recorded_str}\n    running:  {running}\n"
                      f"    -> the recorded schema does not parse with this torch ({e})"), False
    if (recorded.name, recorded.overload_name or "default") != (qname, overload):
        raise CorruptArtifactError(
            f"{where}: the op table records {label} with the schema of "
            f"{recorded.name}.{recorded.overload_name or 'default'}: {recorded_str}")
    chain, current, cur_name = [], recorded, (qname, overload)
    while True:
        run = side.schema(*cur_name) if chain else running
        if run is not None:
            d = compare(current, run)
            if d.kind != "breaking":
                steps = [f"upgraded by {u.name} ({u.summary})" for u in chain]
                if d.kind == "compatible":
                    steps.append(f"{'then ' if chain else ''}compatible drift ({d.describe()})")
                note = f"{label}: " + "; ".join(steps) if steps else None
                return _Plan(label, op_target(qname, overload), chain, op_target(*cur_name), run, note,
                             d.dropped), None, False
        up = find_upgrader(cur_name[0], cur_name[1], current) if len(chain) < MAX_CHAIN else None
        if up is None:
            break
        chain.append(up)
        current = parse(up.new_schema)
        cur_name = (current.name, current.overload_name or "default")
    if running is None and not chain:
        return None, _missing_line(label, qname, recorded_str, kind, side), True
    why = compare(current, run).describe() if run is not None else side.overloads_hint(cur_name[0])
    via = f" (after {', '.join(u.name for u in chain)})" if chain else ""
    shown = run if run is not None else "not registered"
    return None, (f"  {label}\n    recorded: {recorded_str}\n    running:  {shown}\n"
                  f"    -> no upgrader for this change{via}: {why}"), False


def _missing_line(label, qname, recorded_str, kind, side: Side = RUNNING) -> str:
    ns = qname.partition("::")[0]
    if kind == G.OperatorKind.CUSTOM:
        hint = (f"import the Python module that defines the '{ns}' library with torch.library "
                f"before loading")
    else:
        hint = side.overloads_hint(qname) + "; no upgrader is registered for it"
    # one line per op: "<op>  schema: <recorded> -> <what to do>"
    return f"  {label}  schema: {recorded_str}  running: not registered -> {hint}"


def _is_default(arg: S.Argument, default) -> bool:
    """Whether serialized argument ``arg`` holds the schema default ``default``."""
    kind, value = arg.type, arg.value
    if default is None:
        return kind == "as_none"
    if isinstance(default, bool):
        return kind == "as_bool" and value is default
    if isinstance(default, (int, float)):
        return kind in ("as_int", "as_float") and not isinstance(value, bool) and value == default
    if isinstance(default, str):
        return kind == "as_string" and value == default
    if isinstance(default, (list, tuple)):
        return kind in ("as_ints", "as_floats", "as_bools") and list(value) == list(default)
    return False


def _describe_arg(arg: S.Argument) -> str:
    kind, value = arg.type, arg.value
    if kind == "as_tensor":
        return f"tensor {value.name}"
    if kind in ("as_int", "as_float", "as_bool", "as_string", "as_ints", "as_floats", "as_bools"):
        return repr(value)
    return kind.removeprefix("as_")


def _drop_defaults(node: S.Node, plan: _Plan, side: Side, writer: str) -> list[str]:
    """Drop the inputs of ``plan.dropped`` that hold their defaults; a problem line for each that
    does not (the newer torch that wrote it added the argument; the older one cannot express it)."""
    out = []
    for name, default in plan.dropped.items():
        inp = upgraders.find_input(node, name)
        if inp is None:
            continue
        if _is_default(inp.arg, default):
            node.inputs.remove(inp)
            continue
        out.append(f"node {node.name or '?'} passes {name}={_describe_arg(inp.arg)}, and {side.label} has no "
                   f"argument '{name}' (the artifact's torch {writer or '?'} has it, default {default!r}): "
                   f"only its default can be dropped")
    return out


def upgrade_program(serialized_ep, op_records, where: str, plans: dict | None = None) -> tuple[object, list[str]]:
    """(possibly rewritten torch-schema ExportedProgram, human-readable notes of what was upgraded).

    ``op_records``: (qualified_name, overload, schema_str, kind) per op-table entry (kind is
    pt2b_generated.OperatorKind; higher-order and Python callables are skipped). Nodes are
    rewritten in place. Every note reads "<qualified_name>.<overload>: <what was done>".
    Raises MissingOperatorError when ops are simply not registered (custom ops: names the library
    to import) and SchemaDriftError (a MissingOperatorError) when any recorded schema cannot be
    reconciled; either lists every problem op, with both schemas, in one error.
    """
    serialized_ep, notes, _ = reconcile(serialized_ep, op_records, where, plans=plans)
    return serialized_ep, notes


def plan_ops(op_records, where: str, side: Side = RUNNING) -> dict:
    """{recorded target: _Plan} of the ops whose recorded schema differs from ``side``'s, from the op
    table alone (no graph: load() runs it, so a missing op or a drift no upgrader reconciles is
    refused at once). Raises as upgrade_program does."""
    plans, problems, drifted = {}, [], False
    for qname, overload, schema_str, kind in op_records:
        if kind not in (G.OperatorKind.ATEN, G.OperatorKind.CUSTOM):
            continue
        plan, problem, missing = _plan_op(qname, overload, schema_str, kind, where, side)
        if problem:
            problems.append(problem)
            drifted |= not missing
        elif plan is not None:
            plans[plan.target] = plan
    if problems:
        _raise(where, problems, drifted, side)
    return plans


def reconcile(serialized_ep, op_records, where: str, side: Side = RUNNING, plans: dict | None = None):
    """upgrade_program against ``side``: (program, notes, {recorded target: _Plan} of the ops rewritten).
    ``plans``: what plan_ops returned for these records and ``side``, when the caller has it."""
    plans = plan_ops(op_records, where, side) if plans is None else plans
    writer = (getattr(serialized_ep, "torch_version", "") or "").split("+")[0]
    if not plans:
        return serialized_ep, [], {}

    counts = dict.fromkeys(plans, 0)
    bad = []
    for graph in iter_serialized_graphs(serialized_ep.graph_module.graph):
        ctx = None
        for node in graph.nodes:
            plan = plans.get(node.target)
            if plan is None:
                continue
            counts[node.target] += 1
            ctx = ctx or upgraders.Context(graph, where)
            try:
                for up in plan.chain:
                    up.rewrite(node, ctx)
            except upgraders.UpgraderError as e:
                bad.append(f"  {plan.label}: {e}")
                continue
            node.target = plan.final_target
            bad += [f"  {plan.label}: {p}" for p in _drop_defaults(node, plan, side, writer)]
            bad += [f"  {plan.label}: {p}" for p in _node_problems(node, plan.final_schema)]
    if bad:
        raise SchemaDriftError(f"{where}: op nodes could not be reconciled with torch {side.version}'s "
                               f"schemas:\n" + "\n".join(bad))
    notes = []
    for target, plan in plans.items():
        if plan.note:
            n = counts[target]
            notes.append(f"{plan.note} [{n} node{'s' if n != 1 else ''}]" if plan.chain or plan.dropped
                         else plan.note)
    return serialized_ep, notes, plans


def _raise(where: str, problems: list[str], drifted: bool, side: Side = RUNNING):
    head = (f"{where}: {len(problems)} operator(s) recorded by the artifact cannot be used with "
            f"torch {side.version}")
    msg = head + (" (schema drift with no upgrader, or not registered):\n" if drifted
                  else " (not registered):\n") + "\n".join(problems)
    raise (SchemaDriftError if drifted else MissingOperatorError)(msg)


__all__ = ["SchemaDriftError", "Drift", "Side", "compare", "same_schema", "nesting_problem", "type_marks",
           "parse", "find_upgrader", "upgrade_program", "plan_ops", "reconcile", "op_target"]
