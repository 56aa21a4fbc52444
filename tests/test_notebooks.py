"""Every notebook of the book opens on Colab ready to run: its first code cell installs
mha_lib from `repository.url` in _config.yml there, and does nothing anywhere else.

Fix a failure with `.venv/bin/python tests/colab_cell.py` (see its docstring)."""

from __future__ import annotations

import ast
import subprocess
import sys
import types
from pathlib import Path

import nbformat
import pytest

from tests import colab_cell

NOTEBOOKS = colab_cell.book_notebooks()
FIX = "run `.venv/bin/python tests/colab_cell.py` to add or update it"


def first_code_cell(path: Path) -> nbformat.NotebookNode:
    nb = nbformat.read(path, as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code"]
    assert cells, f"{path.name} has no code cell"
    return cells[0]


def pip_url(source: str) -> str:
    """The `git+...` argument of the cell's pip command, read from its syntax tree."""
    urls = [node.value for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and node.value.startswith("git+")]
    assert len(urls) == 1, f"expected one git+ URL in the Colab cell, found {urls}"
    return urls[0].removeprefix("git+")


def run_cell(source: str, *, on_colab: bool, monkeypatch: pytest.MonkeyPatch) -> list:
    """Execute the cell with subprocess.run recorded (never really called)."""
    calls: list = []
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: calls.append((a, k)))
    if on_colab:
        monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    else:
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    exec(compile(source, "<colab cell>", "exec"), {})  # noqa: S102
    return calls


def test_the_book_has_notebooks() -> None:
    assert len(NOTEBOOKS) >= 11, f"expected the chapter notebooks in book/, found {NOTEBOOKS}"


def test_repository_url_is_a_github_repository() -> None:
    url = colab_cell.repository_url()
    # The Colab and Binder buttons, and pip's git+ install, need https://github.com/owner/repo.
    assert url.startswith("https://github.com/") and url.count("/") == 4, url


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_first_code_cell_installs_mha_lib_on_colab(path: Path) -> None:
    cell = first_code_cell(path)
    url = colab_cell.repository_url()
    assert colab_cell.is_colab_cell(cell), (
        f"{path.name}: the first code cell is not the Colab cell; {FIX}")
    assert pip_url(cell.source) == url, (
        f"{path.name}: the Colab cell installs from {pip_url(cell.source)}, but _config.yml's "
        f"repository.url is {url}; {FIX}")
    assert cell.source == colab_cell.cell_source(url), f"{path.name}: Colab cell edited; {FIX}"
    assert cell.get("id") == colab_cell.CELL_ID
    assert colab_cell.TAG in cell.metadata.get("tags", []), (
        f"{path.name}: Colab cell must be tagged {colab_cell.TAG!r} (kept out of the HTML)")
    assert cell.outputs == [], f"{path.name}: the Colab cell must have no stored output"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_cell_ids_are_unique(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    ids = [c.get("id") for c in nb.cells]
    assert len(ids) == len(set(ids)), f"{path.name}: duplicate cell ids"


def test_colab_cell_does_nothing_off_colab(monkeypatch: pytest.MonkeyPatch) -> None:
    source = colab_cell.cell_source(colab_cell.repository_url())
    assert run_cell(source, on_colab=False, monkeypatch=monkeypatch) == []


def test_colab_cell_pip_installs_the_repository_on_colab(
        monkeypatch: pytest.MonkeyPatch) -> None:
    url = colab_cell.repository_url()
    calls = run_cell(colab_cell.cell_source(url), on_colab=True, monkeypatch=monkeypatch)
    assert calls == [(([sys.executable, "-m", "pip", "install", "-q", f"git+{url}"],),
                      {"check": True})]


def test_colab_cell_is_plain_python() -> None:
    # nbval, the sync test and a plain `python` all parse cells as Python: no %magics.
    source = colab_cell.cell_source(colab_cell.repository_url())
    ast.parse(source)
    assert not any(line.lstrip().startswith(("%", "!")) for line in source.splitlines())


def test_script_inserts_then_updates_in_place() -> None:
    """A new notebook gets the cell before its first code cell; a changed repository.url
    rewrites it in place; an up-to-date notebook is left alone."""
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# N. Title"),
        nbformat.v4.new_code_cell("import torch"),
    ])
    assert colab_cell.updated(nb, "https://github.com/a/b")
    assert [c.cell_type for c in nb.cells] == ["markdown", "code", "code"]
    assert pip_url(nb.cells[1].source) == "https://github.com/a/b"
    assert nb.cells[2].source == "import torch"
    assert not colab_cell.updated(nb, "https://github.com/a/b")
    assert colab_cell.updated(nb, "https://github.com/c/d")
    assert len(nb.cells) == 3 and pip_url(nb.cells[1].source) == "https://github.com/c/d"
    nbformat.validate(nb)
