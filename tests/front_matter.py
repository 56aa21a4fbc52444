"""Notebook front matter: make every notebook of book/ work where readers open it.

For each ``book/*.ipynb`` it sets, idempotently (a second run changes nothing) and
without touching any output:

1. **The Colab cell** (``tests/colab_cell.py``): the hidden first code cell that installs
   ``mha_lib`` from ``repository.url`` of _config.yml on Google Colab, and does nothing
   anywhere else.
2. **The head of the first markdown cell**, right under the title: for chapters 1-11 the
   "you are here" strip (``book/figures/strip_NN.svg``, with alt text), then a short
   install note (a Markdown blockquote, which JupyterLab, Colab and the book all render):
   how to install ``mha_lib`` with the light notebook extras and a CPU-only PyTorch when
   the notebook is opened on its own.
3. **Folded exercise solutions** in JupyterLab and Colab, while the book keeps its
   sphinx-exercise dropdowns (the ``{solution-start}`` / ``{solution-end}`` cells are left
   as they are):

   * before each exercise, a notebook-only heading cell ``### Exercise N.k: its title``
     (the directive's title, which a notebook front end does not show; tagged
     ``remove-cell``, so the book does not show it; the book numbers exercises itself);
   * before each solution, a notebook-only heading cell ``#### Solution to Exercise N.k``
     whose section (the solution's explanation and code, up to the next exercise) starts
     folded: cell metadata ``jp-MarkdownHeadingCollapsed: true`` (JupyterLab's collapsed
     heading) and the cell's id in the notebook metadata ``colab.collapsed_sections``
     (Colab's collapsed sections); a markdown cell that holds a ``{solution-end}`` fence
     and then the next exercise is split in two, so that the heading of the next
     exercise can end the folded section;
   * every solution code cell also has its input folded on its own: JupyterLab's
     ``jupyter.source_hidden: true`` and Colab's form view (``cellView: form`` and a first
     line ``# @title Solution to Exercise N.k (code folded: open it to read)``). The
     book drops that ``# @title`` line (``_ext/book_links.py``).

Usage (from the repository root)::

    .venv/bin/python tests/front_matter.py            # update every book/*.ipynb
    .venv/bin/python tests/front_matter.py book/07_masking.ipynb
    .venv/bin/python tests/front_matter.py --check    # change nothing; exit 1 if needed

Run it after adding a chapter, changing exercises or ``repository.url``.
``tests/test_front_matter.py`` checks the result.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import re
import sys
from functools import cache
from pathlib import Path

import nbformat
import yaml

if __package__ in (None, ""):  # run as a script: make `tests` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import colab_cell  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
BOOK = REPO / "book"
TOC = REPO / "_toc.yml"
FIGURES = BOOK / "figures"

MARK = "front_matter"  # cell metadata key of the cells this tool inserts
TAG = "remove-cell"    # notebook-only cells: the book leaves them out
JUPYTERLAB_COLLAPSED = "jp-MarkdownHeadingCollapsed"
TITLE_LINE = "# @title Solution to Exercise {number} (code folded: open it to read)"
TITLE_RE = re.compile(r"^# ?@title\b.*(\n|$)")

NOTE_FIRST = "> **Opened this notebook on its own?**"
CPU_TORCH = "pip install torch --index-url https://download.pytorch.org/whl/cpu"
STRIP_RE = re.compile(r"^!\[[^\n]*\]\(figures/strip_\d+\.svg\)[ \t]*$")

FENCE = r"(?:`{3,}|:{3,})"
EXERCISE_RE = re.compile(rf"^{FENCE}\{{exercise\}}[ \t]*(?P<title>[^\n]*)$", re.MULTILINE)
SOLUTION_START_RE = re.compile(rf"^{FENCE}\{{solution-start\}}\s*(\S+)", re.MULTILINE)
SOLUTION_END_RE = re.compile(rf"^({FENCE})\{{solution-end\}}[^\n]*\n\1[ \t]*$", re.MULTILINE)
LABEL_RE = re.compile(r"^:label:\s*(\S+)", re.MULTILINE)


def install_note(url: str) -> str:
    """The blockquote under each notebook's title (plain Markdown)."""
    return "\n".join([
        f"{NOTE_FIRST} It needs `mha_lib`, the book's library.",
        "> On Google Colab the first code cell installs it. Elsewhere, install a CPU-only",
        "> PyTorch, then the library with its light set of notebook tools:",
        ">",
        "> ```bash",
        f"> {CPU_TORCH}",
        f"> URL={url}",
        '> pip install "mha_lib[notebooks] @ git+$URL"',
        "> ```",
    ])


# --- which chapter is which ---------------------------------------------------------------

@cache
def chapter_numbers(toc: Path = TOC) -> dict[str, int]:
    """Docname -> chapter number, counted as Jupyter Book numbers them: through the
    numbered parts of _toc.yml in order, continuing from part to part."""
    data = yaml.safe_load(toc.read_text(encoding="utf-8"))
    numbers: dict[str, int] = {}
    for part in data.get("parts", []):
        if not part.get("numbered"):
            continue
        for chapter in part.get("chapters", []):
            numbers[str(Path(chapter["file"]).with_suffix(""))] = len(numbers) + 1
    return numbers


def chapter_of(path: Path) -> int | None:
    docname = path.resolve().relative_to(REPO).with_suffix("").as_posix()
    return chapter_numbers().get(docname)


@cache
def _figures_module():
    spec = importlib.util.spec_from_file_location("make_figures", FIGURES / "make_figures.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def strip_line(chapter: int) -> str | None:
    """The Markdown image of chapter ``chapter``'s strip, or None if it has none."""
    figures = _figures_module()
    if chapter not in figures.CHAPTERS:
        return None
    alt = figures.strip_alt(chapter).replace("[", "(").replace("]", ")")
    return f"![{alt}](figures/strip_{chapter:02d}.svg)"


# --- 2. the head of the first markdown cell --------------------------------------------------

def _without_front_matter(lines: list[str]) -> list[str]:
    """The lines of a first markdown cell without a strip or install note put there before."""
    out, i = [], 0
    while i < len(lines):
        if STRIP_RE.match(lines[i]):
            i += 1
        elif lines[i].startswith(NOTE_FIRST):
            while i < len(lines) and lines[i].startswith(">"):
                i += 1
        else:
            out.append(lines[i])
            i += 1
    return out


def head_source(source: str, url: str, chapter: int | None) -> str:
    lines = _without_front_matter(source.split("\n"))
    title = lines[:1] if lines and lines[0].startswith("# ") else []
    body = lines[len(title):]
    while body and not body[0].strip():
        body.pop(0)
    block: list[str] = []
    strip = strip_line(chapter) if chapter else None
    if strip:
        block += [strip, ""]
    block += install_note(url).split("\n")
    parts = title + ([""] if title else []) + block + ([""] + body if body else [])
    # collapse the blank lines that removing old front matter may have left
    text = "\n".join(parts)
    return re.sub(r"\n{3,}", "\n\n", text)


# --- 3. folded solutions -----------------------------------------------------------------------

def _cell_id(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "-", text)[:64]


def _split_markdown(cell: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    """Split a markdown cell before every exercise that does not start it, and after a
    solution-end fence followed by more text."""
    source = cell.source
    cuts = {m.start() for m in EXERCISE_RE.finditer(source) if source[:m.start()].strip()}
    for m in SOLUTION_END_RE.finditer(source):
        if source[m.end():].strip():
            cuts.add(m.end())
    if not cuts:
        return [cell]
    pieces, start = [], 0
    for cut in sorted(cuts) + [len(source)]:
        pieces.append(source[start:cut])
        start = cut
    cells = []
    for k, piece in enumerate(p.strip("\n") for p in pieces):
        if not piece.strip():
            continue
        if not cells:
            new = copy.deepcopy(cell)
            new.source = piece
        else:
            label = LABEL_RE.search(piece) if EXERCISE_RE.match(piece) else None
            suffix = label.group(1) if label else f"part-{k}"
            new = nbformat.v4.new_markdown_cell(piece)
            new.id = _cell_id(f"{cell.get('id', 'cell')}-{suffix}")
        cells.append(new)
    return cells


def _heading(level: int, text: str, kind: str, cell_id: str,
             collapsed: bool = False) -> nbformat.NotebookNode:
    metadata: dict = {MARK: kind, "tags": [TAG]}
    if collapsed:
        metadata[JUPYTERLAB_COLLAPSED] = True
        metadata["id"] = cell_id  # Colab's own cell id, which collapsed_sections names
    cell = nbformat.v4.new_markdown_cell("#" * level + " " + text, metadata=metadata)
    cell.id = cell_id
    return cell


def _exercise_numbers(cells: list, chapter: int | None) -> dict[str, str]:
    """Exercise label -> "N.k" in the order of the {exercise} directives (as the book)."""
    numbers: dict[str, str] = {}
    k = 0
    for cell in cells:
        if cell.cell_type != "markdown":
            continue
        for m in EXERCISE_RE.finditer(cell.source):
            k += 1
            label = LABEL_RE.search(cell.source, m.end())
            key = label.group(1) if label else f"#{k}"
            numbers[key] = f"{chapter}.{k}" if chapter else str(k)
    return numbers


def fold_solutions(nb: nbformat.NotebookNode, chapter: int | None) -> None:
    cells = [c for c in nb.cells if MARK not in c.metadata]  # drop earlier headings
    cells = [piece for c in cells
             for piece in (_split_markdown(c) if c.cell_type == "markdown" else [c])]
    numbers = _exercise_numbers(cells, chapter)
    out, collapsed, in_solution, number, k = [], [], False, "", 0
    for cell in cells:
        if cell.cell_type == "markdown" and EXERCISE_RE.match(cell.source):
            k += 1
            label = LABEL_RE.search(cell.source)
            number = numbers[label.group(1) if label else f"#{k}"]
            title = EXERCISE_RE.match(cell.source).group("title").strip()
            out.append(_heading(3, f"Exercise {number}" + (f": {title}" if title else ""),
                                "exercise-heading",
                                _cell_id(f"nb-exercise-{number.replace('.', '-')}")))
        if cell.cell_type == "markdown" and (start := SOLUTION_START_RE.search(cell.source)):
            in_solution = True
            number = numbers.get(start.group(1), number)
            heading_id = _cell_id(f"nb-solution-{number.replace('.', '-')}")
            out.append(_heading(4, f"Solution to Exercise {number}", "solution-heading",
                                heading_id, collapsed=True))
            collapsed.append(heading_id)
        elif in_solution and cell.cell_type == "code":
            body = TITLE_RE.sub("", cell.source, count=1)
            cell.source = TITLE_LINE.format(number=number) + "\n" + body
            cell.metadata.setdefault("jupyter", {})["source_hidden"] = True
            cell.metadata["cellView"] = "form"
        if cell.cell_type == "markdown" and SOLUTION_END_RE.search(cell.source):
            in_solution = False
        out.append(cell)
    nb.cells = out
    colab = nb.metadata.setdefault("colab", {})
    if collapsed:
        colab["collapsed_sections"] = collapsed
    else:
        colab.pop("collapsed_sections", None)
        if not colab:
            del nb.metadata["colab"]


# --- all of it -------------------------------------------------------------------------------

def updated(nb: nbformat.NotebookNode, url: str, chapter: int | None) -> bool:
    """Apply 1-3 to ``nb``; True if anything changed."""
    before = nbformat.writes(nb)
    colab_cell.updated(nb, url)
    first = next((c for c in nb.cells if c.cell_type == "markdown"), None)
    if first is None:
        first = nbformat.v4.new_markdown_cell("")
        first.id = "front-matter"
        nb.cells.insert(0, first)
    first.source = head_source(first.source, url, chapter)
    fold_solutions(nb, chapter)
    return nbformat.writes(nb) != before


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: book/**/*.ipynb")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if needed")
    args = parser.parse_args(argv)
    url = colab_cell.repository_url()
    stale = []
    for path in args.notebooks or colab_cell.book_notebooks():
        nb = nbformat.read(path, as_version=4)
        if not updated(nb, url, chapter_of(path)):
            continue
        stale.append(path)
        if not args.check:
            nbformat.validate(nb)
            nbformat.write(nb, path)
            print(f"updated {path}")
    if args.check and stale:
        print("notebooks whose front matter is out of date (run tests/front_matter.py):\n  "
              + "\n  ".join(map(str, stale)), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
