"""The corpus the lowering tests run over: zoo models, ExportDB examples, OpInfo single ops,
each as (id, artifact factory, inputs, eager reference, tolerance)."""

from __future__ import annotations

import copy
import dataclasses
import functools

import torch


# How many programs of each corpus run today (torch 2.13): the builders below drop what cannot be
# exported, so tests compare their counts with these (test_lowering.py, test_opinfo_roundtrip.py).
ZOO_PROGRAMS, EXPORTDB_PROGRAMS, OPINFO_PROGRAMS = 20, 35, 611


@dataclasses.dataclass
class Program:
    id: str
    make: object  # () -> (model, args, kwargs, dynamic_shapes, strict)
    rtol: float = 1e-5
    atol: float = 1e-5


def zoo_programs() -> list[Program]:
    from tools.corpus.zoo import make_case, zoo_names

    def maker(name):
        def make():
            c = make_case(name)
            return c.model, c.args, c.kwargs or {}, c.dynamic_shapes, c.strict
        return make

    out = []
    for name in zoo_names():
        c = make_case(name)
        out.append(Program(f"zoo:{name}", maker(name), rtol=max(c.rtol, 1e-4), atol=max(c.atol, 1e-4)))
    return out


@functools.cache
def _exportdb_ok() -> dict:
    from torch._export.db.examples import all_examples

    ok = {}
    for name, case in sorted(all_examples().items()):
        try:
            torch.export.export(copy.deepcopy(case.model), case.example_args, case.example_kwargs or {},
                                dynamic_shapes=case.dynamic_shapes, strict=True)
            ok[name] = case
        except Exception:
            continue
    return ok


def exportdb_programs() -> list[Program]:
    def maker(case):
        return lambda: (copy.deepcopy(case.model), case.example_args, case.example_kwargs or {},
                        case.dynamic_shapes, True)

    return [Program(f"exportdb:{n}", maker(c)) for n, c in _exportdb_ok().items()]


def opinfo_programs(every: int = 1) -> list[Program]:
    from .opinfo_cases import opinfo_cases

    cases = opinfo_cases()
    def maker(c):
        return lambda: (c.module, c.args, c.kwargs, None, False)
    return [Program(f"opinfo:{c.op_name}", maker(c), rtol=1e-4, atol=1e-5) for c in cases[::every]]
