"""The user guide's recipes run as written: each page of docs/guide/ in a fresh folder, its fenced blocks in
order (Python in one scope, `pt2b ...` lines through the CLI), then checks of what the page computed.

Markers a block may start with (comment lines, before its code):
  `# needs: onnxruntime, openvino`  modules it needs; where one is missing the block is skipped
  `# file: NAME.py`                  a file the reader saves: written to the folder (importable), not run
  `# slow: WHY`                      run only by the slow test of the page (marker slow), skipped otherwise
Blocks in other languages (text, console output) are not run. A `bash` block holds only `pt2b` lines."""

from __future__ import annotations

import importlib.util
import pathlib
import re
import shlex
import sys

import pytest
import torch

from exporter.cli import main as cli

ROOT = pathlib.Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guide"
FENCE = re.compile(r"^```(\w*)[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
MARKER = re.compile(r"#\s*(needs|file|slow):\s*(.+?)\s*$")


def blocks(text: str) -> list[tuple[str, str, dict[str, str]]]:
    """(language, code, markers) of every python and bash fence of a page, in order."""
    out = []
    for lang, code in FENCE.findall(text):
        if lang not in ("python", "bash"):
            continue
        markers = {}
        for line in code.splitlines():
            m = MARKER.fullmatch(line.strip())
            if not m:
                break
            markers[m.group(1)] = m.group(2)
        out.append((lang, code, markers))
    return out


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:   # a dotted name whose package is missing
        return False


def missing(markers: dict[str, str]) -> list[str]:
    return [m for m in (n.strip() for n in markers.get("needs", "").split(",")) if m and not installed(m)]


def run_page(name: str, folder: pathlib.Path, monkeypatch, slow: bool = False) -> tuple[dict, list[str]]:
    """Run a guide page's blocks in ``folder`` (those marked slow only with ``slow``): the Python scope it
    leaves and the blocks it skipped."""
    monkeypatch.chdir(folder)
    monkeypatch.setenv("PT2B_CACHE_DIR", str(folder / "cache"))   # on, as a reader has it, in a folder of its own
    monkeypatch.delenv("PT2B_CACHE", raising=False)
    monkeypatch.syspath_prepend(str(folder))
    scope: dict = {"__name__": "guide"}
    skipped, written = [], []
    try:
        for lang, code, markers in blocks((GUIDE / name).read_text()):
            if lacking := missing(markers):
                skipped.append(f"{code.splitlines()[0]} (missing {', '.join(lacking)})")
            elif "slow" in markers and not slow:
                skipped.append(f"{code.splitlines()[0]} (slow)")
            elif "file" in markers:
                (folder / markers["file"]).write_text(code)
                written.append(pathlib.Path(markers["file"]).stem)
            elif lang == "python":
                exec(compile(code, f"docs/guide/{name}", "exec"), scope)  # as a reader pastes it
            else:
                for line in code.splitlines():
                    line = line.split(" #")[0].strip()
                    if not line or line.startswith("#"):
                        continue
                    argv = shlex.split(line)
                    assert argv[0] == "pt2b", f"{name}: a bash block holds only pt2b commands: {line!r}"
                    assert cli(["--quiet", *argv[1:]]) == 0, f"{name}: {line!r} failed"
    finally:
        for module in written:   # a module of the folder is not what another page imports under that name
            sys.modules.pop(module, None)
    return scope, skipped


def pages() -> list[str]:
    return sorted(p.name for p in GUIDE.glob("*.md") if p.name != "README.md")


# ---- what each page must have computed, beyond the asserts its own recipes make ----
def _same_logits(compiled, scope, name):
    assert compiled.backend.name == name
    x = torch.randint(0, 128, (2, 13))   # sizes no block called it with
    torch.testing.assert_close(compiled(input_ids=x).logits, scope["model"](input_ids=x).logits,
                               rtol=1e-4, atol=1e-4)


def _deploy(scope, out, skipped):
    for var, name in (("et", "executorch"), ("vm", "iree"), ("aoti", "inductor")):
        if var in scope:   # the block ran (its backend installed; inductor's in the slow test only)
            _same_logits(scope[var], scope, name)
    assert "DynamicCache" in out   # the failing export showed torch's reason, raised as an ExportError
    assert not (pathlib.Path("cached.pt2b")).exists()
    assert "CausalLMOutputWithPast" in out  # pt2b verify named what the file needs
    assert "wrote tiny.pt2b (methods prefill, decode)" in out and len(set(scope["hf_tokens"])) > 1  # `--hf`
    if "onnxruntime" in " ".join(skipped):
        return
    assert "validation passed" in out
    assert scope["compiled"].backend.name == "onnx"
    x = torch.randint(0, 128, (5, 11))
    torch.testing.assert_close(scope["compiled"](input_ids=x).logits, scope["model"](input_ids=x).logits,
                               rtol=1e-4, atol=1e-4)
    if "openvino" not in " ".join(skipped):
        assert pathlib.Path("llama.xml").exists() and pathlib.Path("llama.bin").exists()


def _generation(scope, out, skipped):
    assert len(scope["tokens"]) == 8 and len(set(scope["tokens"])) > 1   # a real sequence, not one token repeated
    assert set(scope["lowered"].methods) == {"prefill", "decode"}
    if "onnxruntime" in " ".join(skipped):
        return
    assert "key_cache_0" in out and "carried buffer(s)" in out   # the cache lifted, carried and checked
    assert scope["onnx"]["decode"].backend.name == "onnx" and scope["file_tokens"] == scope["tokens"]
    assert scope["nocache"].backend.name == "onnx" and scope["ids"].shape == (1, 12)


def _backend_author(scope, out, skipped):
    assert "0 of 2 models fully covered" in out and "2 of 2 models fully covered" in out   # coverage, before and after
    assert re.search(r"aten::var_mean\.correction -> .*\(instead of prims::[^)]*prims::var\.default", out)  # closure
    # offered the ATen op above the prims ops
    assert "aten::full_like.default" in out              # the OpsetError named what the list misses
    html = pathlib.Path("opsets.html").read_text()
    assert "block.pt2b" in html and "conv.pt2b" in html   # the page is over the folder's models
    allowed = set(scope["mine"]) | {"aten::scaled_dot_product_attention"}
    assert {op.rsplit(".", 1)[0] for op in scope["lowered"].ops()} <= allowed   # the block reached the list
    assert scope["lowered"].validation.status == "passed"
    x = torch.randn(2, 8, 16)   # the shapes it was exported with (static)
    torch.testing.assert_close(scope["Runtime"](scope["lowered"])(x), scope["block"](x), rtol=1e-5, atol=1e-5)
    if "onnxruntime" in " ".join(skipped):
        return
    assert scope["lp"].outside_opset == {"aten::mode.default": 1}
    assert scope["compiled"].share is not None and "aten::mode.default x1" in scope["compiled"].share.describe()
    x = torch.randn(2, 5, 8)   # new values: the split program computes what the model does
    torch.testing.assert_close(scope["compiled"](x), scope["running"](x))


def _operating(scope, out, skipped):
    assert scope["old"].format_version == (1, 2)
    from exporter import load
    from exporter.versioning.formats import FORMAT_VERSION

    assert load("new.pt2b").format_version == FORMAT_VERSION   # upgraded to the current format
    assert "format version:  " + ".".join(map(str, FORMAT_VERSION)) in out
    assert "checksum mismatch in weight segment 0" in out
    assert (scope["first"].from_cache, scope["again"].from_cache) == (False, True)
    assert "removed 1 entries" in out      # `pt2b cache --clear` emptied the cache the recipe filled


def _custom_ops(scope, out, skipped):
    assert "custom op myops::scaled_gelu.default" in out        # pt2b verify named what the file needs
    assert type(scope["q"].exported_program().state_dict["weight"]).__name__ == "ScaledTensor"
    assert "ScaledTensor" in out
    if "torchao" not in " ".join(skipped):
        assert "Int8Tensor" in out
    if "onnxruntime" in " ".join(skipped):
        return
    assert list(scope["lowered"].inlined_custom_ops()) == ["myops::scaled_gelu.default"]
    assert not any(op.startswith("myops::") for op in scope["lowered"].ops())  # the backend got ATen ops
    assert "myops::scaled_gelu.default" in scope["kept"].ops()
    assert "myops::scaled_gelu.default x1" in scope["split"].share.describe()
    x = torch.randn(3, 8)
    for compiled in (scope["compiled"], scope["split"]):
        torch.testing.assert_close(compiled(x), scope["net"](x))


CHECKS = {"deploy-a-transformers-model.md": _deploy, "generation-with-a-kv-cache.md": _generation,
          "backend-author.md": _backend_author, "operating.md": _operating,
          "custom-ops-and-subclasses.md": _custom_ops}


def test_every_page_is_checked_and_indexed():
    index = (GUIDE / "README.md").read_text()
    assert sorted(CHECKS) == pages()
    for name in pages():
        assert f"]({name})" in index, f"docs/guide/README.md does not list {name}"
    for page in [GUIDE / "README.md", *(GUIDE / n for n in pages())]:
        assert "](../glossary.md" in page.read_text(), f"{page.name} does not link the glossary"
    assert "](docs/guide/README.md)" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("name", pages())
def test_the_page_runs(name, tmp_path, monkeypatch, capsys):
    scope, skipped = run_page(name, tmp_path, monkeypatch)
    out = capsys.readouterr().out
    CHECKS[name](scope, out, skipped)


@pytest.mark.backends
def test_deploy_page_on_the_backends_installed_apart(tmp_path, monkeypatch, capsys):
    """ExecuTorch's and IREE's blocks run where that backend is installed (its own venv in CI)."""
    here = [m for m in ("executorch", "iree.runtime") if installed(m)]
    if not here:
        pytest.skip("neither executorch nor iree.runtime is installed")
    scope, skipped = run_page("deploy-a-transformers-model.md", tmp_path, monkeypatch)
    assert {"executorch": "et", "iree.runtime": "vm"}[here[0]] in scope, skipped
    _deploy(scope, capsys.readouterr().out, skipped)


@pytest.mark.slow
def test_deploy_page_with_its_slow_blocks(tmp_path, monkeypatch, capsys):
    scope, skipped = run_page("deploy-a-transformers-model.md", tmp_path, monkeypatch, slow=True)
    assert "aoti" in scope and not any(s.endswith("(slow)") for s in skipped)
    _deploy(scope, capsys.readouterr().out, skipped)


def test_markers_select_what_runs(tmp_path, monkeypatch):
    page = ("```python\n# file: helper_mod.py\nVALUE = 3\n```\n\n```text\nnot run\n```\n\n"
            "```python\n# needs: no_such_module_anywhere\nraise SystemExit('ran')\n```\n\n"
            "```python\n# needs: no_such_package.sub\nraise SystemExit('ran')\n```\n\n"
            "```python\n# slow: compiles\nraise SystemExit('ran')\n```\n\n"
            "```python\nimport helper_mod\nresult = helper_mod.VALUE * 2\n```\n")
    (tmp_path / "guide").mkdir()
    monkeypatch.setattr(sys.modules[__name__], "GUIDE", tmp_path / "guide")
    (tmp_path / "guide" / "p.md").write_text(page)
    work = tmp_path / "work"
    work.mkdir()
    scope, skipped = run_page("p.md", work, monkeypatch)
    assert scope["result"] == 6
    assert skipped == ["# needs: no_such_module_anywhere (missing no_such_module_anywhere)",
                       "# needs: no_such_package.sub (missing no_such_package.sub)", "# slow: compiles (slow)"]
    assert "helper_mod" not in sys.modules
