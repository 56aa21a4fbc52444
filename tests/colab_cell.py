"""The first code cell of every notebook in book/: install mha_lib on Google Colab.

A reader who opens a chapter with the Colab launch button gets a bare Colab kernel
without mha_lib. The first code cell of every notebook therefore installs it from the
book's repository, and only there: locally (and under nbval, `make execute`, Binder) the
``if`` is false, the cell does nothing and prints nothing. The URL comes from
``repository.url`` in _config.yml, the one setting a publisher changes, so it is never
typed by hand. The cell is tagged ``remove-cell``: the HTML book does not show it; its
code is folded in JupyterLab (``jupyter.source_hidden``) and in Colab (form view, with a
``# @title`` first line). ``tests/front_matter.py`` runs this together with the rest of
a notebook's front matter (install note, chapter strip, folded solutions).

Usage (from the repo root)::

    .venv/bin/python tests/colab_cell.py            # add or update the cell in book/**/*.ipynb
    .venv/bin/python tests/colab_cell.py book/12_cost.ipynb
    .venv/bin/python tests/colab_cell.py --check    # exit 1 if any notebook needs a change

Run it after adding a chapter or changing ``repository.url``. It only touches that one
cell (outputs of the other cells are kept); `tests/test_notebooks.py` checks the result.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import nbformat
import yaml

REPO = Path(__file__).resolve().parent.parent
BOOK = REPO / "book"
CONFIG = REPO / "_config.yml"

CELL_ID = "colab-install"
TAG = "remove-cell"  # the HTML book leaves the cell out
# JupyterLab folds the cell's code; Colab shows it as a form (its title line only).
FOLDED = {"jupyter": {"source_hidden": True}, "cellView": "form"}
# A Colab form title: Colab shows this line and folds the code (cellView "form" below).
FIRST_LINE = "# @title Install mha_lib on Google Colab (elsewhere this does nothing)"
# First lines of earlier versions of the cell, still recognised so that they get updated.
LEGACY_FIRST_LINES = (
    "# On Google Colab, install mha_lib from the book's repository; elsewhere this does nothing.",
)


def repository_url(config: Path = CONFIG) -> str:
    """`repository.url` from _config.yml (the single source of truth for the book's home)."""
    url = yaml.safe_load(config.read_text(encoding="utf-8"))["repository"]["url"]
    return str(url).rstrip("/")


def cell_source(url: str) -> str:
    """The cell's code for a repository URL (plain Python, no IPython magics; lines of at
    most 76 characters for a repository URL of up to 60)."""
    return (
        f"{FIRST_LINE}\n"
        "import subprocess, sys\n"
        'if "google.colab" in sys.modules:\n'
        f'    url = "git+{url}"\n'
        '    subprocess.run([sys.executable, "-m", "pip", "install", "-q", url],\n'
        "                   check=True)"
    )


def book_notebooks(book: Path = BOOK) -> list[Path]:
    """Every notebook of the book (the same set `make execute` and nbval use)."""
    return sorted(
        p for p in book.rglob("*.ipynb")
        if not any(part.startswith((".", "_")) for part in p.relative_to(book).parts)
    )


def is_colab_cell(cell: nbformat.NotebookNode) -> bool:
    return cell.cell_type == "code" and (
        cell.get("id") == CELL_ID or cell.source.startswith((FIRST_LINE, *LEGACY_FIRST_LINES))
    )


def updated(nb: nbformat.NotebookNode, url: str) -> bool:
    """Make the notebook's first code cell the Colab cell for `url`; True if anything changed."""
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    wanted = cell_source(url)
    if code and is_colab_cell(nb.cells[code[0]]):
        cell = nb.cells[code[0]]
        before = nbformat.writes(nbformat.v4.new_notebook(cells=[cell]))
        cell.source = wanted
        cell.id = CELL_ID
        tags = cell.metadata.setdefault("tags", [])
        if TAG not in tags:
            tags.append(TAG)
        cell.metadata.update(copy.deepcopy(FOLDED))
        cell.outputs = []
        return before != nbformat.writes(nbformat.v4.new_notebook(cells=[cell]))
    # Any other Colab cell further down is stale: drop it, then insert before the first code cell.
    nb.cells = [c for c in nb.cells if not is_colab_cell(c)]
    cell = nbformat.v4.new_code_cell(wanted, metadata={"tags": [TAG], **copy.deepcopy(FOLDED)})
    cell.id = CELL_ID
    first_code = next((i for i, c in enumerate(nb.cells) if c.cell_type == "code"), len(nb.cells))
    nb.cells.insert(first_code, cell)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: book/**/*.ipynb")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if needed")
    args = parser.parse_args(argv)
    url = repository_url()
    stale = []
    for path in args.notebooks or book_notebooks():
        # One quick pass per file: read, change, write (others may edit notebooks too).
        nb = nbformat.read(path, as_version=4)
        if not updated(nb, url):
            continue
        stale.append(path)
        if not args.check:
            nbformat.validate(nb)
            nbformat.write(nb, path)
            print(f"updated {path}")
    if args.check and stale:
        print("notebooks whose first code cell is not the Colab cell for "
              f"{url}:\n  " + "\n  ".join(map(str, stale)), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
