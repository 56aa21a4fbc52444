"""Every notebook works where readers open it (see tests/front_matter.py): an install note
under the title, the chapter's "you are here" strip (chapters 1-11), the Colab cell, and
exercise solutions folded in JupyterLab and Colab.

Fix a failure with `.venv/bin/python tests/front_matter.py` (it changes no output)."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import nbformat
import pytest

from tests import colab_cell, front_matter

NOTEBOOKS = colab_cell.book_notebooks()
FIX = "run `.venv/bin/python tests/front_matter.py`"
URL = colab_cell.repository_url()
HEADING = re.compile(r"^(#{1,6})\s", re.MULTILINE)


def _read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def _first_markdown(nb: nbformat.NotebookNode) -> str:
    return next(c.source for c in nb.cells if c.cell_type == "markdown")


def _solutions(nb: nbformat.NotebookNode) -> list[tuple[int, int]]:
    """(index of the solution-start cell, index of its solution-end cell)."""
    spans, start = [], None
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        if front_matter.SOLUTION_START_RE.search(cell.source):
            start = i
        if start is not None and front_matter.SOLUTION_END_RE.search(cell.source):
            spans.append((start, i))
            start = None
    return spans


def _level(cell: nbformat.NotebookNode) -> int | None:
    if cell.cell_type != "markdown":
        return None
    levels = [len(m.group(1)) for m in HEADING.finditer(cell.source)]
    return min(levels) if levels else None


# --- the notebooks as committed --------------------------------------------------------

@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_has_the_install_note(path: Path) -> None:
    head = _first_markdown(_read(path))
    has_note = front_matter.install_note(URL) in head
    assert has_note, f"{path.name}: no install note under the title; {FIX}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_chapters_one_to_eleven_show_their_strip(path: Path) -> None:
    chapter = front_matter.chapter_of(path)
    head = _first_markdown(_read(path)).split("\n")
    strips = [line for line in head if front_matter.STRIP_RE.match(line)]
    if chapter is None or chapter > 11:
        assert not strips, f"{path.name}: a strip, but it is not one of chapters 1-11"
        return
    assert strips == [front_matter.strip_line(chapter)], f"{path.name}: strip missing; {FIX}"
    assert head[0].startswith("# ") and not head[1].strip() and head[2] == strips[0], (
        f"{path.name}: the strip belongs right under the title")
    alt = re.match(r"!\[(.*)\]", strips[0]).group(1)
    assert f"chapter {chapter}" in alt and "(3, 4, 6, 2)" in alt, alt
    assert (front_matter.FIGURES / f"strip_{chapter:02d}.svg").is_file()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_solutions_are_folded_in_jupyterlab_and_colab(path: Path) -> None:
    nb = _read(path)
    collapsed = nb.metadata.get("colab", {}).get("collapsed_sections", [])
    problems = []
    for start, end in _solutions(nb):
        # The nearest heading above the solution is its folded, notebook-only heading ...
        above = [i for i in range(start) if _level(nb.cells[i]) is not None]
        heading = nb.cells[above[-1]] if above else None
        if heading is None or heading.metadata.get(front_matter.MARK) != "solution-heading":
            problems.append(f"cell {start}: no 'Solution to Exercise' heading above it")
            continue
        if not heading.metadata.get(front_matter.JUPYTERLAB_COLLAPSED):
            problems.append(f"cell {start}: heading not collapsed for JupyterLab")
        if heading.get("id") not in collapsed or heading.metadata.get("id") != heading.id:
            problems.append(f"cell {start}: heading not in colab.collapsed_sections")
        if front_matter.TAG not in heading.metadata.get("tags", []):
            problems.append(f"cell {start}: the heading would show in the book")
        # ... whose section holds the whole solution (no heading inside it) ...
        if any(_level(nb.cells[i]) for i in range(start, end + 1)):
            problems.append(f"cells {start}-{end}: a heading inside the solution")
        # ... and every solution code cell is folded on its own too.
        for i in range(start, end + 1):
            cell = nb.cells[i]
            if cell.cell_type != "code":
                continue
            if not cell.metadata.get("jupyter", {}).get("source_hidden"):
                problems.append(f"cell {i}: no jupyter.source_hidden")
            if cell.metadata.get("cellView") != "form" or not front_matter.TITLE_RE.match(
                    cell.source):
                problems.append(f"cell {i}: not in Colab's form view (# @title line)")
    assert not problems, f"{path.name}: {FIX}:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_front_matter_is_up_to_date(path: Path) -> None:
    stale = front_matter.updated(_read(path), URL, front_matter.chapter_of(path))
    assert not stale, f"{path.name}: front matter out of date; {FIX}"


# --- the tool ---------------------------------------------------------------------------

@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_tool_is_idempotent_and_keeps_outputs(path: Path) -> None:
    original = _read(path)
    nb = copy.deepcopy(original)
    chapter = front_matter.chapter_of(path)
    front_matter.updated(nb, URL, chapter)
    nbformat.validate(nb)
    assert not front_matter.updated(nb, URL, chapter), "a second run changed the notebook"

    def outputs(book):
        return [c.outputs for c in book.cells if c.cell_type == "code"
                and c.get("id") != colab_cell.CELL_ID]

    assert outputs(nb) == outputs(original), "the tool changed an output"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code[0].metadata.get("cellView") == "form"
    assert code[0].metadata.get("jupyter", {}).get("source_hidden") is True
    assert max(len(line) for line in code[0].source.splitlines()) <= 76


def _toy(*cells: nbformat.NotebookNode) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook(cells=list(cells))
    for i, cell in enumerate(nb.cells):
        cell.id = f"c{i}"
    return nb


def test_tool_splits_the_solution_end_from_the_next_exercise() -> None:
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    nb = _toy(
        md("# Title\n\nText."),
        code("import torch"),
        md("## Exercises\n\nTry.\n\n```{exercise} One\n:label: ex-a\n\nDo one.\n```"),
        md("```{solution-start} ex-a\n:class: dropdown\n```\nBecause."),
        code("print(1)"),
        md("```{solution-end}\n```\n\n```{exercise} Two\n:label: ex-b\n\nDo two.\n```"),
        md("```{solution-start} ex-b\n:class: dropdown\n```"),
        code("# @title old title\nprint(2)"),
        md("```{solution-end}\n```"),
    )
    assert front_matter.updated(nb, "https://github.com/a/b", 7)
    sources = [c.source.split("\n")[0] for c in nb.cells]
    assert sources == [
        "# Title", colab_cell.FIRST_LINE, "import torch", "## Exercises",
        "### Exercise 7.1: One", "```{exercise} One",
        "#### Solution to Exercise 7.1", "```{solution-start} ex-a",
        front_matter.TITLE_LINE.format(number="7.1"), "```{solution-end}",
        "### Exercise 7.2: Two", "```{exercise} Two",
        "#### Solution to Exercise 7.2", "```{solution-start} ex-b",
        front_matter.TITLE_LINE.format(number="7.2"), "```{solution-end}",
    ], sources
    assert nb.cells[14].source.endswith("\nprint(2)") and "old title" not in nb.cells[14].source
    assert nb.metadata["colab"]["collapsed_sections"] == ["nb-solution-7-1", "nb-solution-7-2"]
    assert "figures/strip_07.svg" in nb.cells[0].source
    nbformat.validate(nb)
    assert not front_matter.updated(nb, "https://github.com/a/b", 7)
    # a new repository URL updates the note and the Colab cell, and nothing else
    assert front_matter.updated(nb, "https://github.com/c/d", 7)
    assert "URL=https://github.com/c/d" in nb.cells[0].source
    assert len(nb.cells) == 16
