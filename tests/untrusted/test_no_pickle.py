"""Nothing is ever unpickled (README): load, load_for_backend (a cold lowering and a cache hit),
`pt2b upgrade`, `pt2b inspect` and `pt2b verify` run with every unpickling entry point of Python and
torch made to fail.

The guard is installed in a fresh process before pt2b or torch is imported, so that no import, cache
or lazy first call can unpickle outside it, and every attempt is recorded: an unpickling that pt2b's
code caught and recovered from still fails the test."""

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

from exporter import export_model
from tools.corpus.zoo import make_case

GOLDEN = pathlib.Path(__file__).parents[1] / "golden"

# Installed first in the child: each entry point raises, and records that it was reached.
GUARD = r'''
import _pickle, pickle, sys
ATTEMPTS = []

def _refuse(name):
    def refused(*args, **kwargs):
        ATTEMPTS.append(name)
        raise RuntimeError(f"{name} called: pt2b must never unpickle")
    return refused

def _refusing_class(name, base):
    # a class, so that modules subclassing it at import time still import; using it fails
    def __init__(self, *args, **kwargs):
        ATTEMPTS.append(name)
        raise RuntimeError(f"{name} called: pt2b must never unpickle")
    return type(base.__name__, (base,), {"__init__": __init__})

for mod in (pickle, _pickle):
    for fn in ("loads", "load", "_loads", "_load"):
        if hasattr(mod, fn):
            setattr(mod, fn, _refuse(f"{mod.__name__}.{fn}"))
    for cls in ("Unpickler", "_Unpickler"):
        if hasattr(mod, cls):
            setattr(mod, cls, _refusing_class(f"{mod.__name__}.{cls}", getattr(mod, cls)))

import torch, torch.serialization, torch._weights_only_unpickler as wou, torch.export
torch.load = torch.serialization.load = _refuse("torch.load")
torch.serialization._load = _refuse("torch.serialization._load")
wou.load = _refuse("torch._weights_only_unpickler.load")
wou.Unpickler = _refusing_class("torch._weights_only_unpickler.Unpickler", wou.Unpickler)
torch.export.load = _refuse("torch.export.load")
'''

PROBE = GUARD + r'''
import contextlib, io, json, os, traceback

import tools.corpus.zoo  # registers the custom op some artifacts call
from exporter import load, load_for_backend
from exporter.cli import main
from exporter.cli.inspect import summarize

paths = json.loads(sys.argv[1])
report = {}

def step(name, fn):
    before = len(ATTEMPTS)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
            result = fn()
        ok, detail = result is not False, err.getvalue()[-2000:]
    except BaseException:
        ok, detail = False, traceback.format_exc()[-2000:]
    report[name] = {"ok": ok, "attempts": ATTEMPTS[before:], "detail": detail}

def run_loaded(path):
    prog = load(path, verify=True)
    args, kwargs = prog.exported_program().example_inputs
    return prog(*args, **kwargs) is not None and bool(prog.ops())

def lower(path, **kw):
    lp = load_for_backend(path, "core", **kw)
    args, kwargs = lp.exported_program().example_inputs
    assert lp(*args, **kwargs) is not None
    return lp

os.environ["PT2B_CACHE_DIR"] = paths["cache"]
os.environ.pop("PT2B_CACHE", None)
step("load", lambda: run_loaded(paths["model"]))
step("load golden 1.0 (older minor)", lambda: run_loaded(paths["golden_1_0"]))
step("load golden ops (older op schemas)", lambda: run_loaded(paths["golden_ops"]))
step("load_for_backend cold", lambda: not lower(paths["model"], cache=False).from_cache)
step("load_for_backend cache miss", lambda: not lower(paths["model"], cache=True).from_cache)
step("load_for_backend cache hit", lambda: lower(paths["model"], cache=True).from_cache)
step("upgrade --check", lambda: main(["upgrade", "--check", paths["golden_ops"]]) == 0)
step("upgrade older minor", lambda: main(["upgrade", paths["golden_1_0"], paths["out_1_0"]]) == 0)
step("upgrade older op schemas", lambda: main(["upgrade", paths["golden_ops"], paths["out_ops"]]) == 0)
step("load upgraded", lambda: run_loaded(paths["out_ops"]) and run_loaded(paths["out_1_0"]))
step("inspect", lambda: main(["inspect", paths["model"]]) == 0 and bool(summarize(paths["model"])))
step("verify", lambda: main(["verify", paths["model"]]) == 0)
step("run", lambda: main(["run", paths["model"], "--preset", "core"]) == 0)
print("REPORT" + json.dumps(report))
'''


def _run(paths: dict) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(paths)], capture_output=True, text=True,
                          timeout=600, cwd=pathlib.Path(__file__).parents[2],
                          env={**os.environ, "PYTHONPATH": str(pathlib.Path(__file__).parents[2])})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len("REPORT"):])


def test_runs_with_unpickling_made_impossible(tmp_path):
    """Every step in one child process (one torch import): each must succeed and attempt no unpickling."""
    tmp = tmp_path
    case = make_case("transformer_encoder")
    model = tmp / "model.pt2b"
    export_model(case.model, case.args, model)
    paths = {"model": str(model), "cache": str(tmp / "cache"),
             "golden_1_0": str(tmp / "mlp_1_0.pt2b"), "golden_ops": str(tmp / "gelu_backward_1_11.pt2b"),
             "out_1_0": str(tmp / "mlp_upgraded.pt2b"), "out_ops": str(tmp / "gelu_upgraded.pt2b")}
    pathlib.Path(paths["golden_1_0"]).write_bytes((GOLDEN / "1.0" / "mlp.pt2b").read_bytes())
    pathlib.Path(paths["golden_ops"]).write_bytes((GOLDEN / "ops" / "gelu_backward_1_11.pt2b").read_bytes())
    report = _run(paths)
    assert sorted(report) == sorted(STEPS)
    problems = []
    for step in STEPS:
        r = report[step]
        if r["attempts"]:
            problems.append(f"{step} tried to unpickle: {r['attempts']}\n{r['detail']}")
        elif not r["ok"]:
            problems.append(f"{step} failed with unpickling refused:\n{r['detail']}")
    assert not problems, "\n\n".join(problems)


STEPS = ["load", "load golden 1.0 (older minor)", "load golden ops (older op schemas)", "load_for_backend cold",
         "load_for_backend cache miss", "load_for_backend cache hit", "upgrade --check", "upgrade older minor",
         "upgrade older op schemas", "load upgraded", "inspect", "verify", "run"]


def test_the_guard_catches_unpickling(tmp_path):
    """The guard itself: torch.load of a torch.save'd file, and pickle.loads, are refused and recorded
    (torch.export.load of a .pt2 archive likewise, which is why `pt2b convert` warns about .pt2)."""
    saved = tmp_path / "t.pt"
    torch.save({"w": torch.ones(2)}, saved)
    script = GUARD + (
        "import io, pickle\n"
        "for name, fn in [('pickle', lambda: pickle.loads(b'\\x80\\x04K\\x01.')),\n"
        f"                 ('torch.load', lambda: torch.load({str(saved)!r})),\n"
        "                 ('Unpickler', lambda: pickle.Unpickler(io.BytesIO(b'')).load())]:\n"
        "    try:\n"
        "        fn()\n"
        "        print('NOT REFUSED', name)\n"
        "    except RuntimeError as e:\n"
        "        assert 'must never unpickle' in str(e), e\n"
        "print('ATTEMPTS', len(ATTEMPTS))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "NOT REFUSED" not in out.stdout and "ATTEMPTS 3" in out.stdout, out.stdout
