"""Every notebook reads and runs wherever it is opened (``_ext/notebook_forms.py``).

The stored notebooks are plain Markdown and Python that JupyterLab, Colab and a lone
download show as they are; the book converts them to MyST at build time. Fix a failure in
the stored form with ``.venv/bin/python tests/front_matter.py`` (it changes no output).
"""

from __future__ import annotations

import ast
import base64
import copy
import importlib.util
import re
import subprocess
import sys
import types
from pathlib import Path

import nbformat
import pytest
from pybtex.database import parse_file

from tests import front_matter

forms = front_matter.forms
NOTEBOOKS = front_matter.book_notebooks()
FIX = "run `.venv/bin/python tests/front_matter.py`"
REPO_URL = "https://github.com/example-owner/example-book"
BIB = parse_file(front_matter.BOOK / "references.bib")
# MyST that only the HTML book understands; none of it may be stored in a notebook.
RAW_MYST = re.compile(r"^\s*(```+|:::+)\{|\{[a-z-]+(:[a-z]+)?\}`|^:label:|^\([\w-]+\)=\s*$",
                      re.MULTILINE)


def _read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def _markdown(nb: nbformat.NotebookNode) -> list[str]:
    return [c.source for c in nb.cells if c.cell_type == "markdown"]


def _exec(source: str) -> None:
    exec(compile(source, "<set-up cell>", "exec"), {})  # noqa: S102


# --- the stored form -------------------------------------------------------------------------

def test_the_book_has_notebooks() -> None:
    assert len(NOTEBOOKS) >= 19


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_in_its_stored_form(path: Path) -> None:
    nb = _read(path)
    repo = front_matter.recorded_repository(nb)
    assert repo is None or forms.github_repository(repo) == repo, repo
    assert not front_matter.updated(copy.deepcopy(nb), repo, front_matter.chapter_of(path)), (
        f"{path.name}: not in its stored form; {FIX}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_myst_only_syntax_is_stored(path: Path) -> None:
    """Directives, roles and labels show as raw text outside the book: none is stored."""
    found = [m.group(0).strip() for text in _markdown(_read(path))
             for m in RAW_MYST.finditer(text)]
    assert not found, f"{path.name}: MyST syntax a notebook front end shows raw: {found[:5]}"


def test_the_raw_myst_pattern_catches_what_it_looks_for() -> None:
    for raw in ("```{exercise} One", ":::{note}", "see {cite:p}`a`", ":label: ex-a",
                "{ref}`x`", "(my-label)="):
        assert RAW_MYST.search(raw), raw
    for fine in ("```python", "$\\{x\\}$", "a `{` brace", "[A (2017)](references.md#a)"):
        assert not RAW_MYST.search(fine), fine


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_cell_ids_are_unique(path: Path) -> None:
    ids = [c.get("id") for c in _read(path).cells]
    assert len(ids) == len(set(ids)), f"{path.name}: repeated cell ids"


# --- the set-up cell -----------------------------------------------------------------------

@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_first_code_cell_is_the_set_up_cell(path: Path) -> None:
    nb = _read(path)
    cell = next(c for c in nb.cells if c.cell_type == "code")
    assert forms.is_setup_cell(cell), f"{path.name}: first code cell is not the set-up; {FIX}"
    assert cell.source == forms.setup_source(front_matter.recorded_repository(nb))
    assert forms.REMOVE in cell.metadata.get("tags", [])
    assert cell.metadata.get("jupyter", {}).get("source_hidden") is True
    assert cell.metadata.get("cellView") == "form"
    assert not cell.outputs


@pytest.mark.parametrize("repo", [None, REPO_URL])
def test_set_up_cell_is_plain_python_in_the_column(repo: str | None) -> None:
    source = forms.setup_source(repo)
    ast.parse(source)
    assert max(map(len, source.splitlines())) <= 76
    assert not any(line.lstrip().startswith(("%", "!")) for line in source.splitlines())


@pytest.mark.parametrize("repo", [None, REPO_URL])
def test_set_up_cell_does_nothing_where_mha_lib_imports(repo: str | None) -> None:
    assert importlib.util.find_spec("mha_lib") is not None
    _exec(forms.setup_source(repo))  # no error, no install


def _without_mha_lib(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "mha_lib" else real(name, *a))


@pytest.mark.parametrize("repo", [None, REPO_URL])
def test_set_up_cell_says_what_to_install(repo: str | None,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    _without_mha_lib(monkeypatch)
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    with pytest.raises(ModuleNotFoundError) as error:
        _exec(forms.setup_source(repo))
    message = str(error.value)
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in message
    wanted = f'pip install "mha_lib[notebooks] @ git+{repo}"' if repo else \
        'pip install -e ".[notebooks]"'
    assert wanted in message, message


def test_set_up_cell_installs_from_the_repository_on_colab(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _without_mha_lib(monkeypatch)
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    calls: list[list[str]] = []
    monkeypatch.setattr(subprocess, "run", lambda args, **kw: calls.append(args))
    _exec(forms.setup_source(REPO_URL))
    assert calls == [[sys.executable, "-m", "pip", "install", "-q",
                      f"mha_lib @ git+{REPO_URL}"]]


# --- figures ---------------------------------------------------------------------------------

@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_figures_are_embedded_and_match_their_files(path: Path) -> None:
    """Every image travels inside the notebook as the PNG copy of its SVG (JupyterLab
    shows PNG attachments, not SVG ones), the copy drawn from the current SVG."""
    nb = _read(path)
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", cell.source)
        assert all(re.match(r"attachment:[\w-]+\.png$", i) for i in images), (
            f"{path.name}: an image by path is lost when the notebook is alone: {images}")
        for name in (i.split(":", 1)[1] for i in images):
            data = cell.get("attachments", {}).get(name, {}).get("image/png")
            assert data, f"{path.name}: attachment {name} missing; {FIX}"
            assert base64.b64decode(data) == (forms.FIGURES / name).read_bytes(), (
                f"{path.name}: attachment {name} differs from book/figures/{name}; {FIX}")


def test_every_diagram_has_a_fresh_png_copy(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("rasterize",
                                                  forms.FIGURES / "rasterize.py")
    rasterize = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rasterize)
    assert rasterize.stale() == [], (
        "PNG copies drawn from an older SVG: run .venv/bin/python book/figures/rasterize.py")
    # planted: a copy drawn from another version of its SVG, and a missing copy
    svg = next(forms.FIGURES.glob("*.svg"))
    (tmp_path / "a.svg").write_bytes(svg.read_bytes() + b"\n")
    (tmp_path / "a.png").write_bytes(svg.with_suffix(".png").read_bytes())
    (tmp_path / "b.svg").write_bytes(svg.read_bytes())
    assert [p.name for p in rasterize.stale(tmp_path)] == ["a.svg", "b.svg"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_chapters_one_to_eleven_show_their_strip_under_the_title(path: Path) -> None:
    chapter = front_matter.chapter_of(path)
    head = _markdown(_read(path))[0].split("\n")
    strips = [line for line in head if forms.STRIP_RE.match(line)]
    if chapter is None or chapter > 11:
        assert not strips
        return
    assert head[0].startswith("# ") and head[2] == forms.strip_line(chapter), path.name
    alt = re.match(r"!\[(.*)\]", head[2]).group(1)
    # the split heads' shape: the running example's, except in the chapters that work
    # on other shapes (chapter 7's padded batch of 4, d2l's heads folded into it, and the
    # einops example's heads first with d_k = 3)
    heads = {7: "(4, 4, 6, 2)", 9: "(16, 6, 2)", 10: "(4, 3, 6, 3)"}.get(
        chapter, "(3, 4, 6, 2)")
    assert f"chapter {chapter}" in alt and f"split heads {heads}" in alt, alt


# --- exercises and solutions ----------------------------------------------------------------

@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_exercises_are_numbered_and_solutions_folded(path: Path) -> None:
    nb = _read(path)
    chapter = front_matter.chapter_of(path)
    exercises = [forms.exercise_label(c) for c in nb.cells if forms.exercise_label(c)]
    solutions = [forms.solution_label(c) for c in nb.cells if forms.solution_label(c)]
    assert exercises == solutions, f"{path.name}: each exercise needs one solution after it"
    if chapter is not None:
        assert len(exercises) >= 2, f"{path.name}: a chapter ends with exercises"
    collapsed = nb.metadata.get("colab", {}).get("collapsed_sections", [])
    k, in_solution = 0, False
    for cell in nb.cells:
        if forms.exercise_label(cell):
            k += 1
            assert cell.source.startswith(f"### Exercise {chapter}.{k}: "), cell.source[:40]
        elif forms.solution_label(cell):
            assert cell.source.startswith(f"#### Solution to Exercise {chapter}.{k}\n")
            assert cell.metadata.get(forms.JUPYTERLAB_COLLAPSED) is True
            assert cell.id in collapsed and cell.metadata.get("id") == cell.id
            in_solution = True
        elif cell.cell_type == "markdown" and cell.source.lstrip().startswith("#"):
            in_solution = False
        elif in_solution and cell.cell_type == "code":
            assert cell.source.startswith(forms.TITLE_LINE.format(number=f"{chapter}.{k}"))
            assert cell.metadata.get("jupyter", {}).get("source_hidden") is True


def test_exercise_labels_are_unique_in_the_book() -> None:
    labels = [forms.exercise_label(c) for p in NOTEBOOKS for c in _read(p).cells
              if forms.exercise_label(c)]
    assert len(labels) == len(set(labels)) and len(labels) >= 54


def _toy() -> nbformat.NotebookNode:
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    nb = nbformat.v4.new_notebook(cells=[
        md("# Title\n\nText, as in ([Vaswani et al., 2017](references.md#vaswani2017attention))."),
        code("import torch"),
        md("## Exercises"),
        md("### Exercise 9: One\n\nDo one.", metadata={forms.META: {"exercise": "ex-a"}}),
        md("#### Solution to Exercise 9\n\nBecause.", metadata={forms.META: {"solution": "ex-a"}}),
        code("print(1)"),
        md("Also this."),
        code("# @title old\nprint(2)"),
        md("### Exercise 9: Two\n\nDo two.", metadata={forms.META: {"exercise": "ex-b"}}),
        md("#### Solution to Exercise 9", metadata={forms.META: {"solution": "ex-b"}}),
        code("print(3)"),
        md("## After\n\nNot a solution."),
        code("print(4)"),
    ])
    for i, cell in enumerate(nb.cells):
        cell.id = f"c{i}"
    return nb


def test_stamp_numbers_folds_and_is_idempotent() -> None:
    nb = _toy()
    forms.stamp(nb, REPO_URL, 7)
    heads = [c.source.split("\n")[0] for c in nb.cells]
    assert heads[0] == "# Title" and forms.is_setup_cell(nb.cells[1])
    assert "### Exercise 7.1: One" in heads and "### Exercise 7.2: Two" in heads
    assert "#### Solution to Exercise 7.2" in heads
    titles = [c.source.split("\n")[0] for c in nb.cells if c.cell_type == "code"
              and c.metadata.get("cellView") == "form" and not forms.is_setup_cell(c)]
    assert titles == [forms.TITLE_LINE.format(number=n) for n in ("7.1", "7.1", "7.2")]
    assert nb.cells[-1].source == "print(4)" and "cellView" not in nb.cells[-1].metadata
    assert nb.metadata["colab"]["collapsed_sections"] == ["nb-solution-7-1", "nb-solution-7-2"]
    assert "attachment:strip_07.png" in nb.cells[0].source
    assert forms.install_note(REPO_URL) in nb.cells[0].source
    nbformat.validate(nb)
    again = copy.deepcopy(nb)
    forms.stamp(again, REPO_URL, 7)
    assert nbformat.writes(again) == nbformat.writes(nb)
    forms.stamp(again, None, 7)  # unpublished: the note and cell say "from a clone"
    assert forms.install_note(None) in again.cells[0].source
    assert "REPOSITORY" not in again.cells[1].source


def test_the_book_form_has_exercises_solutions_and_citations() -> None:
    nb = _toy()
    forms.stamp(nb, None, 7)
    book = forms.to_myst(nb)
    text = [c.source for c in book.cells]
    assert "{cite:p}`vaswani2017attention`" in text[0] and "references.md" not in text[0]
    assert "figures/strip_07.svg" in text[0] and "attachment:" not in text[0]
    ex = [t for t in text if t.startswith("```{exercise}")]
    assert ex == ["```{exercise} One\n:label: ex-a\n\nDo one.\n```",
                  "```{exercise} Two\n:label: ex-b\n\nDo two.\n```"]
    starts = [i for i, t in enumerate(text) if t.startswith("```{solution-start}")]
    ends = [i for i, t in enumerate(text) if t.startswith("```{solution-end}")]
    assert len(starts) == len(ends) == 2
    assert text[starts[0]] == "```{solution-start} ex-a\n:class: dropdown\n```\nBecause."
    # the first solution runs over its code, text and more code, up to the next exercise
    assert text[ends[0] - 1].endswith("print(2)") and text[ends[0] + 1].startswith("```{exer")
    assert text[ends[1] + 1].startswith("## After")
    assert nb.cells[0].source.count("references.md") == 1, "to_myst changed its input"


@pytest.mark.parametrize("repo", [None, REPO_URL])
def test_the_book_form_leaves_out_the_install_note(repo: str | None) -> None:
    """The install note is for a notebook opened on its own: the stored notebook keeps it,
    the HTML book does not show it, and what was around it stays."""
    nb = _toy()
    forms.stamp(nb, repo, 7)
    assert forms.NOTE_FIRST in nb.cells[0].source
    head = forms.to_myst(nb).cells[0].source
    assert forms.NOTE_FIRST not in head and "pip install" not in head, head
    assert head.startswith("# Title\n\n![") and "figures/strip_07.svg" in head
    assert "{cite:p}`vaswani2017attention`" in head and "\n\n\n" not in head
    assert forms.NOTE_FIRST in nb.cells[0].source, "to_myst changed its input"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_each_notebook_converts_for_the_book(path: Path) -> None:
    book = forms.to_myst(_read(path))
    text = "\n".join(_markdown(book))
    assert text.count("```{solution-start}") == text.count("```{solution-end}") \
        == text.count("```{exercise}")
    assert "references.md#" not in text and "attachment:" not in text
    assert forms.NOTE_FIRST not in text


# --- citations -------------------------------------------------------------------------------

def test_author_year_labels_are_unique() -> None:
    labels = [forms_label(entry) for entry in BIB.entries.values()]
    assert len(labels) == len(set(labels)), "two entries print alike: add 2023a/2023b"


def forms_label(entry: object) -> str:
    sys.path.insert(0, str(front_matter.REPO / "_ext"))
    from book_links import author_year_label
    return author_year_label(entry)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_citations_read_as_the_book_prints_them(path: Path) -> None:
    for role, text, key in forms.citations("\n".join(_markdown(_read(path)))):
        assert key in BIB.entries, f"{path.name}: {key} is not in references.bib"
        label = forms_label(BIB.entries[key])  # "Vaswani et al., 2017"
        names, year = label.rsplit(", ", 1)
        wanted = label if role == "p" else f"{names} ({year})"
        assert text == wanted, f"{path.name}: citation of {key} reads {text!r}, not {wanted!r}"


# --- the download's form ----------------------------------------------------------------------

@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_a_download_links_to_the_published_book(path: Path) -> None:
    alone = forms.standalone(_read(path), REPO_URL, front_matter.chapter_of(path))
    text = "\n".join(_markdown(alone))
    assert not forms.CHAPTER_LINK_RE.search(text), "a relative link to another page is left"
    assert alone.metadata[forms.META]["repository"] == REPO_URL
    assert forms.is_setup_cell(next(c for c in alone.cells if c.cell_type == "code"))
    assert f'REPOSITORY = "{REPO_URL}"' in forms.setup_source(REPO_URL)


def test_published_links_and_repository_setting() -> None:
    assert forms.pages_url("https://github.com/Owner/book") == "https://owner.github.io/book/"
    assert forms.pages_url("https://github.com/o/o.github.io") == "https://o.github.io/"
    for url in ("https://github.com/o/r", "https://github.com/o/r.git", "git@github.com:o/r.git",
                "ssh://git@github.com/o/r"):
        assert forms.github_repository(url) == "https://github.com/o/r", url
    for url in ("https://gitlab.com/o/r", "/tmp/clone", "https://github.com/o"):
        assert forms.github_repository(url) is None, url
    assert forms.repository({"BOOK_REPOSITORY": REPO_URL}) == REPO_URL
    assert forms.repository({"BOOK_REPOSITORY": ""}) is None
    with pytest.raises(ValueError, match="BOOK_REPOSITORY"):
        forms.repository({"BOOK_REPOSITORY": "https://example.com/x"})
    link = "[chapter 5](05_splitting_heads.ipynb#why-several-heads)"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# T\n\n" + link)])
    alone = forms.standalone(nb, REPO_URL, None)
    assert ("(https://example-owner.github.io/example-book/book/05_splitting_heads.html"
            "#why-several-heads)") in alone.cells[0].source
    assert link in forms.standalone(nb, None, None).cells[0].source


# --- one heading per section ----------------------------------------------------------------

HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", re.MULTILINE)
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)


def repeated_headings(markdown: list[str]) -> list[str]:
    """Headings whose text appears more than once on a page (code fences skipped)."""
    seen: dict[str, int] = {}
    for text in markdown:
        for m in HEADING.finditer(FENCE.sub("", text)):
            seen[m.group(2)] = seen.get(m.group(2), 0) + 1
    return [h for h, n in seen.items() if n > 1]


@pytest.mark.parametrize("path", NOTEBOOKS + sorted(front_matter.BOOK.glob("*.md")),
                         ids=lambda p: p.name)
def test_no_heading_is_repeated_on_a_page(path: Path) -> None:
    if path.suffix == ".md":
        forms_ = [[path.read_text(encoding="utf-8")]]
    else:
        nb = _read(path)
        forms_ = [_markdown(nb), _markdown(forms.to_myst(nb))]
    for markdown in forms_:
        repeated = repeated_headings(markdown)
        assert not repeated, f"{path.name}: headings repeated on the page: {repeated}"


def test_a_repeated_heading_is_found() -> None:
    assert repeated_headings(["## Exercises", "text\n\n## Exercises"]) == ["## Exercises"[3:]]
    assert repeated_headings(["## A\n\n```python\n## A\n```"]) == []
