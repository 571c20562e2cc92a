"""A selection of the opset explorer (a preset or supported ops, kept ops, more decompositions)
evaluated over the corpus routes the way the page does it, with plan_lowering's rules (tests compare
it with load_for_backend), and `pt2b opset closure`'s report of it."""

from __future__ import annotations

import dataclasses

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
    or a backend's that inlines) also gets the kernels of the custom ops it does not name."""
    keep, extra = set(sel.keep), set(sel.decompose) & set(data["available"])
    if sel.preset is None:
        sup = set(sel.supported)
        table = {n for n in data["available"] if n not in sup and n not in keep} | (extra - keep)
        opset = lists = sup
    else:
        p = data["presets"][sel.preset]
        table = ({n for n in p["table"] if n not in keep} | extra) - keep
        opset = None if p["opset"] is None else set(p["opset"])
        lists = set(p["lists"]) if p.get("lists") is not None else None
    base = set(table)  # (what a kernel that does not trace leaves is accepted as it is)
    if lists is not None:
        table |= {k for k in data.get("kernels", ()) if k not in lists and k not in keep}

    def accepts(op: str) -> bool:
        if opset is None:
            return op not in base or op in keep
        return op in opset or op in keep or (not op.startswith(ATEN_LIKE) and op not in base)

    return table, accepts


def evaluate(data: dict, sel: Selection) -> dict:
    """Per model: its lowered op set and the ops outside what the selection accepts; the op counts
    across the corpus; coverage; the greedy "implement next" list."""
    table, accepts = table_and_accepts(data, sel)
    infra = set(data["infrastructure"])
    per_model = {}
    for m in data["models"]:
        routes = route_trace.ProgramRoutes([data["trees"][i] for i in m["trees"]], m["leaves"], m["unlowered"], True)
        ops = [o for o in route_trace.evaluate(routes, table) if o not in infra]
        per_model[m["name"]] = {"ops": ops, "missing": [o for o in ops if not accepts(o)]}
    counts: dict[str, int] = {}
    for r in per_model.values():
        for o in r["ops"]:
            counts[o] = counts.get(o, 0) + 1
    covered = sum(1 for r in per_model.values() if not r["missing"])
    return {"models": per_model, "counts": dict(sorted(counts.items())), "covered": covered,
            "next": greedy_next([set(r["missing"]) for r in per_model.values()])}


def route_of(data: dict, op: str, table: set) -> dict | None:
    """The first recorded call site of ``op`` in the corpus, expanded under ``table``."""
    def find(tree):
        if tree["op"] == op:
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


def closure_report(data: dict, sel: Selection) -> str:
    res = evaluate(data, sel)
    table, _ = table_and_accepts(data, sel)
    n = len(res["models"])
    what = f"supported ops ({len(sel.supported)})" if sel.preset is None else f"preset {sel.preset}"
    lines = [f"{what}: {len(table)} decompositions apply; {res['covered']} of {n} corpus models lower to accepted ops only"]
    lines.append(f"ops in the lowered corpus ({len(res['counts'])}; models using each):")
    missing_all: dict[str, list[str]] = {}
    for name, r in res["models"].items():
        for o in r["missing"]:
            missing_all.setdefault(o, []).append(name)
    for o, c in sorted(res["counts"].items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"  {c:4d}  {o}" + ("   (cannot be reached: not accepted)" if o in missing_all else ""))
    if missing_all:
        lines.append(f"cannot reach the accepted set ({len(missing_all)} ops):")
        for o, names in sorted(missing_all.items()):
            lines.append(f"  {o}: needed by {len(names)} model(s), e.g. {names[0]}")
            for parent in _parents_of(data, o, table)[:1]:
                route = route_of(data, parent, table)
                if route is not None:
                    lines += ["      " + ln for ln in render_route(route)]
    if res["next"]:
        lines.append("implement next (models covered after each):")
        lines += [f"  {o} -> {k} of {n}" for o, k in res["next"]]
    return "\n".join(lines)


def _parents_of(data: dict, op: str, table: set) -> list[str]:
    """Decomposed ops whose route emits ``op`` under ``table`` (for explaining where it comes from)."""
    out = []

    def walk(tree):
        if "children" in tree and tree["op"] in table:
            if any(c["op"] == op for c in tree["children"]) and tree["op"] not in out:
                out.append(tree["op"])
            for c in tree["children"]:
                walk(c)

    for t in data["trees"]:
        walk(t)
    return out
