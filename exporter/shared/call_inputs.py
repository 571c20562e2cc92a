"""What a call of a program must pass, in words: its inputs' readable names and where a call of another
structure departs from the one it was exported with. Loaded and lowered programs and runtime_ref say it alike."""

from __future__ import annotations

from .._torch.pytree import pytree

__all__ = ["leaf_names", "mismatch", "positional_names"]


def positional_names(in_spec, forward_names: list[str]) -> list[str]:
    """Names of the positional arguments ('args[i]' where the program did not record one)."""
    n = in_spec.children()[0].num_children
    return [forward_names[i] if i < len(forward_names) else f"args[{i}]" for i in range(n)]


def leaf_names(in_spec, forward_names: list[str]) -> list[str]:
    """Readable pytree paths of the flat inputs: 'x', "inputs['a'][1]", 'scale' (a kwarg)."""
    dummy = pytree.tree_unflatten(list(range(in_spec.num_leaves)), in_spec)
    positional = positional_names(in_spec, forward_names)
    names = []
    for path, _ in pytree.tree_flatten_with_path(dummy)[0]:
        key = path[1]
        head = str(key.key) if isinstance(key, pytree.MappingKey) else positional[key.idx]
        names.append(head + pytree.keystr(path[2:]))
    return names


def _node_children(value):
    """(type, context, children) of a pytree node, or None for a leaf."""
    if pytree.tree_is_leaf(value):
        return None
    handler = pytree.SUPPORTED_NODES[pytree._get_node_type(value)]
    children, context = handler.flatten_fn(value)
    return pytree._get_node_type(value), context, list(children)


def _describe_spec(spec) -> str:
    if spec.is_leaf():
        return "a leaf"
    name = getattr(spec.type, "__name__", str(spec.type))
    if spec.type is dict:
        return f"a dict with keys {list(spec.context)}"
    return f"a {name} of {spec.num_children} item(s)"


def _structure_diff(spec, value, path: str) -> str | None:
    """Where `value` first departs from `spec`, in words, or None if it matches."""
    if spec.is_leaf():
        return None
    node = _node_children(value)
    if node is None or node[0] is not spec.type or node[1] != spec.context or len(node[2]) != spec.num_children:
        got = type(value).__name__ if node is None else f"{type(value).__name__} of {len(node[2])} item(s)"
        if isinstance(value, dict):
            got = f"a dict with keys {list(value)}"
        return f"{path}: expected {_describe_spec(spec)}, got {got}"
    for i, (child_spec, child) in enumerate(zip(spec.children(), node[2])):
        key = repr(spec.context[i]) if spec.type is dict else str(i)
        diff = _structure_diff(child_spec, child, f"{path}[{key}]")
        if diff:
            return diff
    return None


def mismatch(in_spec, positional: list[str], args: tuple, kwargs: dict) -> str:
    """How a call's (args, kwargs) differ from ``in_spec`` (the program's input structure; ``positional``:
    its positional arguments' names): what was expected, what was given, and the first difference."""
    args_spec, kwargs_spec = in_spec.children()
    kw_keys = list(kwargs_spec.context)
    expected = f"{args_spec.num_children} positional argument(s) ({', '.join(positional)})"
    if kw_keys:
        expected += f" and keyword argument(s) {kw_keys}"
    got = f"{len(args)} positional and keyword argument(s) {list(kwargs)}"
    head = f"inputs do not match the program's signature: expected {expected}; got {got}"
    missing = [k for k in kw_keys if k not in kwargs]
    unexpected = [k for k in kwargs if k not in kw_keys]
    if missing or unexpected:
        head += f" (missing {missing}, unexpected {unexpected})"
    if len(args) == args_spec.num_children and set(kwargs) == set(kw_keys):
        pairs = [*zip(positional, args_spec.children(), args),
                 *((k, s, kwargs[k]) for k, s in zip(kw_keys, kwargs_spec.children()))]
        for name, spec, value in pairs:
            detail = _structure_diff(spec, value, name)
            if detail:
                return f"{head}\n  first difference: {detail}"
    return head
