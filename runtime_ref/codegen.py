"""A planned graph as one straight-line Python function: every value a local variable, every
callable and constant a default argument (bound once), `del` at each value's last use.

Nothing from the program is pasted into the source: names are generated (v<slot>, k<slot>, f<step>,
q<n>) and every value -- op callables, constants, dict keys, keyword names -- is passed as a default
argument, so an untrusted artifact cannot inject code here."""

from __future__ import annotations

from .getters import SlotRef, has_slot

__all__ = ["compile_steps"]


class _Source:
    def __init__(self, n_user: int):
        self.n_user = n_user
        self.defaults: dict[str, object] = {}

    def bind(self, prefix: str, value) -> str:
        name = f"{prefix}{len(self.defaults)}"
        self.defaults[name] = value
        return name

    def slot(self, slot: int, constants: list) -> str:
        if slot < self.n_user:
            return f"v{slot}"
        value = constants[slot - self.n_user]
        return f"v{slot}" if value is _NODE else self.bind("k", value)

    def expr(self, template, constants: list) -> str:
        """Source for one argument template (slot refs become names, everything else a default)."""
        if type(template) is SlotRef:
            return self.slot(int(template), constants)
        if not has_slot(template):
            return self.bind("k", template)
        if isinstance(template, (list, tuple)):
            items = ", ".join(self.expr(t, constants) for t in template)
            return f"[{items}]" if isinstance(template, list) else f"({items}{',' if len(template) == 1 else ''})"
        pairs = ", ".join(f"{self.bind('q', k)}: {self.expr(v, constants)}" for k, v in template.items())
        return "{" + pairs + "}"


_NODE = object()  # marks a slot whose value a step computes (a local variable, not a constant)


def compile_steps(steps, n_user: int, constants: list, node_slots: set, output_slots: list, trash: int):
    """``steps``: (callable, args template, kwargs template, out slot, slots freed after) in order.
    Returns `run(leaves) -> tuple of outputs`."""
    consts = [(_NODE if n_user + i in node_slots else c) for i, c in enumerate(constants)]
    src = _Source(n_user)
    lines = []
    if n_user:
        lines.append(f"    {', '.join(f'v{i}' for i in range(n_user))}, = leaves")
    for fn, args, kwargs, out, free in steps:
        call = src.bind("f", fn) + "(" + ", ".join(src.expr(a, consts) for a in args)
        if kwargs:
            call += (", " if args else "") + "**" + src.expr(kwargs, consts)
        call += ")"
        lines.append(f"    {call}" if out == trash else f"    v{out} = {call}")
        if free:
            lines.append(f"    del {', '.join(f'v{s}' for s in free)}")
    outs = [src.slot(s, consts) for s in output_slots]
    lines.append(f"    return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
    params = "".join(f", {name}={name}" for name in src.defaults)
    source = f"def run(leaves{params}):\n" + "\n".join(lines) + "\n"
    namespace = dict(src.defaults)
    exec(compile(source, "<runtime_ref plan>", "exec"), namespace)  # noqa: S102 -- generated names only
    run = namespace["run"]
    run.__pt2b_source__ = source
    return run
