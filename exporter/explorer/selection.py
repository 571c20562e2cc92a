"""A selection of the opset explorer (a preset or supported ops, kept ops, more decompositions)
evaluated over the corpus routes the way the page does it, with plan_lowering's rules (tests compare
it with load_for_backend), and `pt2b opset closure`'s report of it."""

from __future__ import annotations

import dataclasses

from ..ops import OpMatcher
from . import route_trace
from .coverage import greedy_next

ATEN_LIKE = ("aten::", "prims::")


@dataclasses.dataclass
class Selection:
    preset: str | None = "core"            # None: supported-ops mode
    supported: tuple[str, ...] = ()
    keep: tuple[str, ...] = ()
    decompose: tuple[str, ...] = ()

    def load_kwargs(self) -> dict:
        from ..backends import names as backend_names

        if self.preset is None:
            kw = {"supported_ops": list(self.supported)}
        else:  # (the page offers the installed backends beside the presets)
            kw = {"backend" if self.preset in backend_names() else "preset": self.preset}
        if self.keep:
            kw["keep"] = list(self.keep)
        if self.decompose:
            kw["decompose"] = list(self.decompose)
        return kw


def table_and_accepts(data: dict, sel: Selection):
    """(op names decomposed, accepts(op name)) for ``sel`` with plan_lowering's rules: an op list (yours,
    or a backend's that inlines) also gets the kernels of the custom ops it does not name. Every op list
    is read by OpMatcher, as plan_lowering reads it ("aten::mm" every overload, "aten.add.Tensor",
    "aten::mul.*"); the page's script implements the same matcher."""
    keep = OpMatcher(sel.keep)
    extra = {n for n in data["available"] if n in OpMatcher(sel.decompose) and n not in keep}
    if sel.preset is None:
        sup = OpMatcher(sel.supported)
        table = {n for n in data["available"] if n not in sup and n not in keep} | extra
        opset = lists = sup
    else:
        p = data["presets"][sel.preset]
        table = {n for n in p["table"] if n not in keep} | extra
        opset = None if p["opset"] is None else OpMatcher(p["opset"])
        lists = OpMatcher(p["lists"]) if p.get("lists") is not None else None
    base = set(table)  # (what a kernel that does not trace leaves is accepted as it is)
    if lists is not None:
        table |= {k for k in data.get("kernels", ()) if k not in lists and k not in keep}

    def accepts(op: str) -> bool:
        if opset is None:
            return op not in base or op in keep
        return op in opset or op in keep or (not op.startswith(ATEN_LIKE) and op not in base)

    return table, accepts


def evaluate(data: dict, sel: Selection) -> dict:
    """Per model: its lowered op set, the ops outside what the selection accepts, what would meet each
    (``needs``: the op, or the ATen op whose decomposition emits a prims op) and the decomposed ops
    that emit them (``producers``); the op counts across the corpus; coverage; the greedy "implement
    next" list (coverage.greedy_next)."""
    table, accepts = table_and_accepts(data, sel)
    infra = set(data["infrastructure"])
    per_model = {}
    for m in data["models"]:
        routes = route_trace.ProgramRoutes([data["trees"][i] for i in m["trees"]], m["leaves"], m["unlowered"], True)
        ops = [o for o in route_trace.evaluate(routes, table) if o not in infra]
        missing = [o for o in ops if not accepts(o)]
        needs: set = set()
        producers: dict[str, dict] = {o: {} for o in missing}  # (in the order the routes reach them)

        def emit(op, parent, above):
            if op in producers:
                needs.add(frozenset([op, above]) if above is not None and op.startswith("prims::") else frozenset([op]))
                if parent is not None:
                    producers[op][parent] = None

        if missing:
            route_trace.walk(routes, table, emit)
        per_model[m["name"]] = {"ops": ops, "missing": missing, "needs": sorted(sorted(n) for n in needs),
                                "producers": {o: list(p) for o, p in producers.items()}}
    counts: dict[str, int] = {}
    for r in per_model.values():
        for o in r["ops"]:
            counts[o] = counts.get(o, 0) + 1
    covered = sum(1 for r in per_model.values() if not r["missing"])
    return {"models": per_model, "counts": dict(sorted(counts.items())), "covered": covered,
            "next": greedy_next([r["needs"] for r in per_model.values()])}


def route_of(data: dict, op: str, table: set, emits: str | None = None) -> dict | None:
    """The first recorded call site of ``op`` in the corpus (one whose decomposition emits ``emits``,
    if given), expanded under ``table``."""
    def find(tree):
        if tree["op"] == op and (emits is None or any(c["op"] == emits for c in tree.get("children", ()))):
            return tree
        for c in tree.get("children", ()):
            hit = find(c)
            if hit is not None:
                return hit
        return None

    for t in data["trees"]:
        hit = find(t)
        if hit is not None:
            return _expand(hit, table)
    return None


def _expand(tree: dict, table: set) -> dict:
    if "children" in tree and tree["op"] in table:
        return {"op": tree["op"], "children": [_expand(c, table) for c in tree["children"]]}
    return {"op": tree["op"]}


def render_route(tree: dict, indent: str = "") -> list[str]:
    lines = [indent + tree["op"] + ("  ->" if tree.get("children") else "")]
    for c in tree.get("children", ()):
        lines += render_route(c, indent + "    ")
    return lines


def unreachable(res: dict) -> dict[str, dict]:
    """Op -> {"models": the models needing it, "producers": the decomposed ops emitting it}, for every
    op of ``res`` (evaluate's result) outside the accepted set, by name."""
    out: dict[str, dict] = {}
    for name, r in res["models"].items():
        for o in r["missing"]:
            entry = out.setdefault(o, {"models": [], "producers": {}})
            entry["models"].append(name)
            entry["producers"].update(dict.fromkeys(r["producers"][o]))
    return {o: {"models": e["models"], "producers": list(e["producers"])} for o, e in sorted(out.items())}


def closure_report(data: dict, sel: Selection) -> str:
    res = evaluate(data, sel)
    table, _ = table_and_accepts(data, sel)
    n = len(res["models"])
    what = f"supported ops ({len(sel.supported)})" if sel.preset is None else f"preset {sel.preset}"
    lines = [f"{what}: {len(table)} decompositions apply; {res['covered']} of {n} corpus models lower to accepted ops only"]
    lines.append(f"ops in the lowered corpus ({len(res['counts'])}; models using each):")
    missing_all = unreachable(res)
    for o, c in sorted(res["counts"].items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"  {c:4d}  {o}" + ("   (cannot be reached: not accepted)" if o in missing_all else ""))
    if missing_all:
        lines.append(f"cannot reach the accepted set ({len(missing_all)} ops):")
        for o, e in missing_all.items():
            names, producers = e["models"], e["producers"]
            more = f" and {len(producers) - 5} more" if len(producers) > 5 else ""
            made = f"; emitted by {', '.join(producers[:5])}{more}" if producers else "; the program calls it"
            lines.append(f"  {o}: needed by {len(names)} model(s), e.g. {names[0]}{made}")
            for parent in producers[:1]:
                route = route_of(data, parent, table, emits=o)
                if route is not None:
                    lines += ["      " + ln for ln in render_route(route)]
    if res["next"]:
        lines.append("implement next (models covered after each):")
        instead: dict[str, set] = {}  # an ATen op -> the prims ops its decomposition emits that it meets
        for r in res["models"].values():
            for need in r["needs"]:
                for o in need:
                    if not o.startswith("prims::"):
                        instead.setdefault(o, set()).update(p for p in need if p != o)
        lines += [f"  {o} -> {k} of {n}" + (f"  (instead of {', '.join(sorted(instead[o]))})" if instead.get(o) else "")
                  for o, k in res["next"]]
    return "\n".join(lines)
