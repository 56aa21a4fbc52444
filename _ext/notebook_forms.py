"""The three forms of a chapter notebook, and the book's one repository setting.

A chapter is opened in four places: the HTML book, JupyterLab (with or without the MyST
renderer ``jupyterlab-myst``), Google Colab and a lone downloaded ``.ipynb``. Only the
book understands MyST directives and roles, so the notebooks are **stored in plain
Markdown** that reads well everywhere, and converted for the book at build time:

* **stored** (``book/*.ipynb``, written by :func:`stamp` through ``tests/front_matter.py``):

  - the first code cell checks for ``mha_lib`` and, when it is missing, says what to
    install (on Colab it installs it from the repository, when one is set);
  - under the title, a short install note, and for chapters 1-11 the "you are here" strip;
  - every figure ``figures/NAME.svg`` is embedded as a cell attachment, its PNG copy
    ``attachment:NAME.png`` (``book/figures/rasterize.py``; JupyterLab shows PNG
    attachments, not SVG ones), so a notebook on its own still shows it;
  - an exercise is a Markdown cell that starts ``### Exercise N.k: title`` (its label in
    the cell's metadata, ``mha_book.exercise``); its solution starts at a cell
    ``#### Solution to Exercise N.k`` (``mha_book.solution``), folded in JupyterLab and
    Colab, and runs up to the next heading (JupyterLab folds exactly that far); solution
    code cells are folded too (``source_hidden``, Colab's form view with a ``# @title``);
  - a citation is a Markdown link to the references page, with the text the book prints:
    ``[Vaswani et al. (2017)](references.md#vaswani2017attention)`` in the text's flow,
    ``([Vaswani et al., 2017](references.md#vaswani2017attention))`` in parentheses,
    several in one pair of parentheses separated by ``; ``.

* **book** (:func:`to_myst`, at Sphinx's ``source-read``): the install note is left out
  (the book's reader runs no notebook; the download keeps it), exercises become
  sphinx-exercise's ``{exercise}``, solutions ``{solution-start}``/``{solution-end}``
  dropdowns, citation links ``{cite:t}``/``{cite:p}`` roles, attachments the SVG files.

* **download** (:func:`standalone`, written over the book's ``_sources/*.ipynb``): the
  stored form stamped with the build's repository, with links to other chapters pointing
  at the published book.

The repository is one setting (:func:`repository`): ``BOOK_REPOSITORY`` if set, else
``git remote get-url origin`` when that is a GitHub repository, else none. With none, no
page or notebook links to a repository: the install note says how to install from a clone.
"""

from __future__ import annotations

import base64
import copy
import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parent.parent
BOOK = REPO / "book"
FIGURES = BOOK / "figures"
META = "mha_book"  # notebook and cell metadata key of everything this module writes

GITHUB_RE = re.compile(
    r"^(?:https://github\.com/|git@github\.com:|ssh://git@github\.com/)"
    r"(?P<owner>[A-Za-z0-9](?:[A-Za-z0-9-]{0,38}))/(?P<name>[A-Za-z0-9._-]+?)(?:\.git)?/?$")
CPU_TORCH = "pip install torch --index-url https://download.pytorch.org/whl/cpu"
TITLE_LINE = "# @title Solution to Exercise {number} (code folded: open it to read)"
TITLE_RE = re.compile(r"^# ?@title\b.*(\n|$)")
SETUP_PREFIX = "# @title Set-up:"
SETUP_TITLES = {True: "# @title Set-up: mha_lib, the book's library (Colab installs it here)",
                False: "# @title Set-up: is mha_lib, the book's library, installed?"}
SETUP_ID = "setup-mha-lib"
NOTE_FIRST = "> **Running this notebook on its own?**"
OLD_NOTE_FIRST = "> **Opened this notebook on its own?**"
REMOVE = "remove-cell"  # the HTML book leaves a cell with this tag out
JUPYTERLAB_COLLAPSED = "jp-MarkdownHeadingCollapsed"

EXERCISE_HEAD_RE = re.compile(r"^### Exercise (?P<number>[\w.]*): (?P<title>[^\n]*)\n?")
SOLUTION_HEAD_RE = re.compile(r"^#### Solution to Exercise [\w.]*[ \t]*\n?")
STRIP_RE = re.compile(r"^!\[[^\n]*\]\(attachment:strip_\d+\.png\)[ \t]*$")
FIGURE_RE = re.compile(r"(!\[[^\]\n]*\]\()figures/([\w-]+)\.svg\)")
ATTACHMENT_RE = re.compile(r"(!\[[^\]\n]*\]\()attachment:([\w-]+)\.(?:svg|png)\)")
CITE_LINK = r"\[[^\]\n]+\]\(references\.md#[\w-]+\)"
CITE_ONE_RE = re.compile(r"\[(?P<text>[^\]\n]+)\]\(references\.md#(?P<key>[\w-]+)\)")
CITE_P_RE = re.compile(rf"\((?P<links>{CITE_LINK}(?:; {CITE_LINK})*)\)")
CITE_T_RE = re.compile(
    r"\[(?P<text>[^\]\n]+ \(\d{4}[a-z]?\))\]\(references\.md#(?P<key>[\w-]+)\)")
CHAPTER_LINK_RE = re.compile(
    r"\]\((?P<page>(?:\d\d_[\w-]+|appendix_[\w-]+)\.ipynb|intro\.md|references\.md"
    r"|appendix_[\w-]+\.md)(?P<anchor>#[^)\s]*)?\)")


# --- the repository setting ---------------------------------------------------------------

def github_repository(url: str) -> str | None:
    """``https://github.com/owner/name`` for any form of a GitHub URL, else None."""
    m = GITHUB_RE.match(url.strip())
    return f"https://github.com/{m['owner']}/{m['name']}" if m else None


def repository(environ: Mapping[str, str] = os.environ, root: Path = REPO) -> str | None:
    """The book's repository: ``BOOK_REPOSITORY``, else a GitHub ``origin``, else None.

    ``BOOK_REPOSITORY`` must be a GitHub repository (Colab and Binder open notebooks from
    GitHub); set it empty to build as unpublished even in a clone of GitHub.
    """
    given = environ.get("BOOK_REPOSITORY")
    if given is not None:
        if not given.strip():
            return None
        url = github_repository(given)
        if url is None:
            raise ValueError(f"BOOK_REPOSITORY: expected a GitHub repository such as "
                             f"https://github.com/owner/name, got {given!r}")
        return url
    try:
        origin = subprocess.run(["git", "-C", str(root), "remote", "get-url", "origin"],
                                capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return github_repository(origin.stdout) if origin.returncode == 0 else None


def pages_url(repo: str) -> str:
    """Where GitHub Pages publishes ``repo``'s book: ``https://owner.github.io/name/``."""
    owner, name = repo.rstrip("/").split("/")[-2:]
    host = f"{owner.lower()}.github.io"
    return f"https://{host}/" if name.lower() == host else f"https://{host}/{name}/"


# --- the stored form ------------------------------------------------------------------------

def install_note(repo: str | None) -> str:
    """The blockquote under each notebook's title (plain Markdown)."""
    if repo:
        lines = ["> On Google Colab the first code cell installs it. Elsewhere, install a CPU-only",
                 "> PyTorch, then the library with its notebook tools:", ">", "> ```bash",
                 f"> {CPU_TORCH}", f'> pip install "mha_lib[notebooks] @ git+{repo}"']
    else:
        lines = ["> Install a CPU-only PyTorch, then, from the root of a clone of the book's",
                 "> repository, the library with its notebook tools:", ">", "> ```bash",
                 f"> {CPU_TORCH}", '> pip install -e ".[notebooks]"']
    return "\n".join([f"{NOTE_FIRST} It needs `mha_lib`, the book's library.", *lines, "> ```"])


def setup_source(repo: str | None) -> str:
    """The first code cell: does nothing when ``mha_lib`` imports; otherwise installs it on
    Colab (when there is a repository) or stops with what to install."""
    if repo:
        return "\n".join([SETUP_TITLES[True], "import importlib.util, subprocess, sys", "",
            f'REPOSITORY = "{repo}"',
            'if importlib.util.find_spec("mha_lib") is None:',
            '    if "google.colab" in sys.modules:',
            '        subprocess.run([sys.executable, "-m", "pip", "install", "-q",',
            '                        f"mha_lib @ git+{REPOSITORY}"], check=True)',
            "        importlib.invalidate_caches()",
            "    else:",
            "        raise ModuleNotFoundError(",
            '            "This chapter needs mha_lib, the library of the book "',
            '            "\'Multi-Head Attention, step by step\'. Install a CPU-only "',
            '            "PyTorch, then the library, and restart the kernel:\\n"',
            '            "  pip install torch --index-url "',
            '            "https://download.pytorch.org/whl/cpu\\n"',
            "            f'  pip install \"mha_lib[notebooks] @ git+{REPOSITORY}\"')",
        ])
    return "\n".join([SETUP_TITLES[False], "import importlib.util", "",
        'if importlib.util.find_spec("mha_lib") is None:',
        "    raise ModuleNotFoundError(",
        '        "This chapter needs mha_lib, the library of the book "',
        '        "\'Multi-Head Attention, step by step\'. Install a CPU-only "',
        '        "PyTorch, then, in a clone of the book\'s repository, the "',
        '        "library, and restart the kernel:\\n"',
        '        "  pip install torch --index-url "',
        '        "https://download.pytorch.org/whl/cpu\\n"',
        "        '  pip install -e \".[notebooks]\"')",
    ])


def is_setup_cell(cell: nbformat.NotebookNode) -> bool:
    return cell.cell_type == "code" and (
        cell.get("id") == SETUP_ID or cell.source.startswith(SETUP_PREFIX))


def _set_setup_cell(nb: nbformat.NotebookNode, repo: str | None) -> None:
    """Make the first code cell the set-up cell for ``repo`` (updated in place if it is
    one already, so that its execution count stays)."""
    metadata = {"tags": [REMOVE], "jupyter": {"source_hidden": True}, "cellView": "form"}
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    if code and is_setup_cell(nb.cells[code[0]]):
        cell = nb.cells[code[0]]
        nb.cells = [c for c in nb.cells if c is cell or not is_setup_cell(c)]
    else:
        nb.cells = [c for c in nb.cells if not is_setup_cell(c)]
        cell = nbformat.v4.new_code_cell()
        first_code = next((i for i, c in enumerate(nb.cells) if c.cell_type == "code"),
                          len(nb.cells))
        nb.cells.insert(first_code, cell)
    cell.source = setup_source(repo)
    cell.id = SETUP_ID
    cell.metadata = metadata


def _figures_module():
    import importlib.util
    import sys
    spec = importlib.util.spec_from_file_location("make_figures", FIGURES / "make_figures.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


_STRIPS: dict[int, str | None] = {}


def strip_line(chapter: int) -> str | None:
    """The Markdown image of chapter ``chapter``'s strip, or None if it has none."""
    if chapter not in _STRIPS:
        figures = _figures_module()
        if chapter in figures.CHAPTERS:
            alt = figures.strip_alt(chapter).replace("[", "(").replace("]", ")")
            _STRIPS[chapter] = f"![{alt}](attachment:strip_{chapter:02d}.png)"
        else:
            _STRIPS[chapter] = None
    return _STRIPS[chapter]


def _without_notes(lines: list[str], strips: bool) -> list[str]:
    """``lines`` without the install note (the blockquote that starts with NOTE_FIRST)
    and, if ``strips``, without the "you are here" strip's image line."""
    kept, i = [], 0
    while i < len(lines):
        if strips and re.match(
                r"^!\[[^\n]*\]\((?:figures/|attachment:)strip_\d+\.(?:svg|png)\)",
                lines[i]):
            i += 1
        elif lines[i].startswith((NOTE_FIRST, OLD_NOTE_FIRST)):
            while i < len(lines) and lines[i].startswith(">"):
                i += 1
        else:
            kept.append(lines[i])
            i += 1
    return kept


def without_install_note(source: str) -> str:
    """``source`` without the install note (the blockquote that starts with NOTE_FIRST)."""
    kept = _without_notes(source.split("\n"), strips=False)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(kept))


def _head_source(source: str, repo: str | None, chapter: int | None) -> str:
    # drop a strip or an install note put there before
    kept = _without_notes(source.split("\n"), strips=True)
    title = kept[:1] if kept and kept[0].startswith("# ") else []
    body = kept[len(title):]
    while body and not body[0].strip():
        body.pop(0)
    block: list[str] = []
    strip = strip_line(chapter) if chapter else None
    if strip:
        block += [strip, ""]
    block += install_note(repo).split("\n")
    text = "\n".join(title + ([""] if title else []) + block + ([""] + body if body else []))
    return re.sub(r"\n{3,}", "\n\n", text)


def _attach_figures(cell: nbformat.NotebookNode) -> None:
    """``figures/NAME.svg`` images become the attachment ``NAME.png``, the SVG's PNG copy."""
    if cell.cell_type != "markdown":
        return
    cell.source = FIGURE_RE.sub(r"\1attachment:\2.png)", cell.source)
    cell.source = ATTACHMENT_RE.sub(r"\1attachment:\2.png)", cell.source)
    names = [name for _, name in ATTACHMENT_RE.findall(cell.source)]
    if not names:
        cell.pop("attachments", None)
        return
    cell.attachments = {
        f"{name}.png": {"image/png": base64.b64encode(
            (FIGURES / f"{name}.png").read_bytes()).decode()}
        for name in names}


def exercise_label(cell: nbformat.NotebookNode) -> str | None:
    return cell.metadata.get(META, {}).get("exercise") if cell.cell_type == "markdown" else None


def solution_label(cell: nbformat.NotebookNode) -> str | None:
    return cell.metadata.get(META, {}).get("solution") if cell.cell_type == "markdown" else None


def _ends_solution(cell: nbformat.NotebookNode) -> bool:
    """A solution runs up to the next heading (JupyterLab folds exactly that far)."""
    return cell.cell_type == "markdown" and (
        cell.source.lstrip().startswith("#") or exercise_label(cell) or solution_label(cell))


def _number_exercises(nb: nbformat.NotebookNode, chapter: int | None) -> list[str]:
    """Renumber exercise and solution headings; fold solutions; the solution headings' ids."""
    collapsed: list[str] = []
    numbers: dict[str, str] = {}
    in_solution, number = False, ""
    for cell in nb.cells:
        if (label := exercise_label(cell)) is not None:
            number = f"{chapter}.{len(numbers) + 1}" if chapter else str(len(numbers) + 1)
            numbers[label] = number
            m = EXERCISE_HEAD_RE.match(cell.source)
            if m is None:
                raise ValueError(f"exercise {label}: its cell must start with "
                                 f"'### Exercise N.k: title', got {cell.source[:40]!r}")
            cell.source = f"### Exercise {number}: {m['title']}\n" + cell.source[m.end():]
            in_solution = False
        elif (label := solution_label(cell)) is not None:
            if label not in numbers:
                raise ValueError(f"solution {label}: no exercise with that label before it")
            number = numbers[label]
            body = SOLUTION_HEAD_RE.sub("", cell.source, count=1).lstrip("\n")
            cell.source = f"#### Solution to Exercise {number}\n\n" + body
            cell.source = cell.source.rstrip("\n")
            heading_id = "nb-solution-" + number.replace(".", "-")
            cell.id = heading_id
            cell.metadata[JUPYTERLAB_COLLAPSED] = True
            cell.metadata["id"] = heading_id  # Colab's own id, named by collapsed_sections
            collapsed.append(heading_id)
            in_solution = True
        elif _ends_solution(cell):
            in_solution = False
        elif in_solution and cell.cell_type == "code":
            body = TITLE_RE.sub("", cell.source, count=1)
            cell.source = TITLE_LINE.format(number=number) + "\n" + body
            cell.metadata.setdefault("jupyter", {})["source_hidden"] = True
            cell.metadata["cellView"] = "form"
    return collapsed


def stamp(nb: nbformat.NotebookNode, repo: str | None, chapter: int | None) -> None:
    """Give ``nb`` the stored form for ``repo`` (idempotent; outputs are not touched)."""
    nb.metadata[META] = {"repository": repo or ""}
    _set_setup_cell(nb, repo)
    first = next((c for c in nb.cells if c.cell_type == "markdown"), None)
    if first is None:
        first = nbformat.v4.new_markdown_cell("")
        first.id = "front-matter"
        nb.cells.insert(0, first)
    first.source = _head_source(first.source, repo, chapter)
    for cell in nb.cells:
        _attach_figures(cell)
    collapsed = _number_exercises(nb, chapter)
    colab = nb.metadata.setdefault("colab", {})
    if collapsed:
        colab["collapsed_sections"] = collapsed
    else:
        colab.pop("collapsed_sections", None)
        if not colab:
            del nb.metadata["colab"]


# --- the book's form --------------------------------------------------------------------------

def cite_roles(text: str) -> str:
    """Citation links -> ``{cite:p}`` / ``{cite:t}`` roles."""
    def parenthetical(m: re.Match) -> str:
        return "{cite:p}`" + ",".join(k["key"] for k in CITE_ONE_RE.finditer(m["links"])) + "`"
    text = CITE_P_RE.sub(parenthetical, text)
    return CITE_T_RE.sub(lambda m: "{cite:t}`" + m["key"] + "`", text)


def citations(text: str) -> list[tuple[str, str, str]]:
    """``(role, text, key)`` of every citation link in ``text``, in order."""
    found: list[tuple[int, str, str, str]] = []
    taken: list[tuple[int, int]] = []
    for m in CITE_P_RE.finditer(text):
        taken.append(m.span())
        for link in CITE_ONE_RE.finditer(m["links"]):
            found.append((m.start() + link.start(), "p", link["text"], link["key"]))
    for m in CITE_T_RE.finditer(text):
        if not any(a <= m.start() < b for a, b in taken):
            found.append((m.start(), "t", m["text"], m["key"]))
    return [(role, t, k) for _, role, t, k in sorted(found)]


def to_myst(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The book's form of a stored notebook (a new notebook; ``nb`` is not changed)."""
    nb = copy.deepcopy(nb)
    out: list[nbformat.NotebookNode] = []
    open_solution: str | None = None

    def close() -> None:
        nonlocal open_solution
        if open_solution is not None:
            end = nbformat.v4.new_markdown_cell("```{solution-end}\n```")
            end.id = f"{open_solution}-end"[:64]
            out.append(end)
            open_solution = None

    for cell in nb.cells:
        if cell.cell_type == "markdown":
            # The install note is for a notebook opened on its own (stored, downloaded);
            # a reader of the HTML book is not running one.
            cell.source = without_install_note(cell.source)
            if _ends_solution(cell):
                close()
            if (label := exercise_label(cell)) is not None:
                m = EXERCISE_HEAD_RE.match(cell.source)
                body = cell.source[m.end():].strip("\n")
                cell.source = (f"```{{exercise}} {m['title']}\n:label: {label}\n\n"
                               f"{body}\n```")
            elif (label := solution_label(cell)) is not None:
                body = SOLUTION_HEAD_RE.sub("", cell.source, count=1).strip("\n")
                cell.source = f"```{{solution-start}} {label}\n:class: dropdown\n```\n{body}"
                open_solution = label
            cell.source = cite_roles(ATTACHMENT_RE.sub(r"\1figures/\2.svg)", cell.source))
            cell.pop("attachments", None)
        out.append(cell)
    close()
    nb.cells = out
    return nb


# --- the download's form ------------------------------------------------------------------------

def standalone(nb: nbformat.NotebookNode, repo: str | None,
               chapter: int | None) -> nbformat.NotebookNode:
    """A notebook that is whole on its own: stamped for ``repo``; with a repository, links to
    the book's other pages point at the published book."""
    nb = copy.deepcopy(nb)
    stamp(nb, repo, chapter)
    if repo:
        base = pages_url(repo) + "book/"

        def published(m: re.Match) -> str:
            page = re.sub(r"\.(ipynb|md)$", ".html", m["page"])
            return f"]({base}{page}{m['anchor'] or ''})"
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                cell.source = CHAPTER_LINK_RE.sub(published, cell.source)
    return nb
