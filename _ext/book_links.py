"""A local Sphinx extension for the book (loaded through ``sphinx.local_extensions``).

1. mha_lib's docstrings stay plain text (``help()`` reads them too) and say "Derived in
   chapter 5" or "(chapters 5, 9)". On the API page, autodoc runs them through
   :func:`link_chapters`, which turns every chapter number into a link to that chapter.
   Chapter numbers are counted from _toc.yml as Jupyter Book numbers them: through the
   numbered parts in order, continuing from part to part. A number with no chapter is a
   build warning (so ``-W`` fails).
2. Solution code cells carry a first line ``# @title Solution ...`` for Colab's form view
   (see ``tests/front_matter.py``); the HTML book drops that line, since its solution
   dropdown already says what it is.
3. A BibTeX title may hold TeX math (``{$O(n^2)$}``); pybtex writes it as plain text with
   its dollars. After sphinxcontrib-bibtex has built the bibliography, ``$...$`` in a
   citation becomes a math node, which MathJax typesets.
4. The notebooks are stored in plain Markdown that reads well in every front end
   (``notebook_forms.py``); at ``source-read`` each becomes the book's form (exercises,
   solutions and citations as MyST), stamped with the build's repository.
5. The repository is one setting (``notebook_forms.repository``): with one, the
   repository button and the Colab and Binder launch buttons use it; with none, the book
   has none of them. The ``.ipynb`` a reader downloads is the notebook made whole on its
   own (``notebook_forms.standalone``).
6. Citations read the same in the text and in the bibliography: author and year, in
   parentheses in the text, ``(Vaswani et al., 2017)`` or ``Vaswani et al. (2017)``, and
   as the bibliography's labels, ``[Vaswani et al., 2017]``; entries sorted as the labels
   read: first author's last name, then year (ignoring case and TeX braces,
   ``{Gemma Team}`` under G).
7. Each bibliography entry ends with "Cited in: ...", links to the pages whose text cites
   it, read from the pages themselves at build time, so the list cannot drift.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import notebook_forms as forms  # noqa: E402  (_ext/ is on sys.path during the build)
import yaml
from docutils import nodes
from sphinx.application import Sphinx
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinx.util import logging

logger = logging.getLogger(__name__)

# "chapter 5", "Chapter 14", "chapters 5, 9", "chapters 4 to 8", "chapters 5 and 8"
CHAPTERS_RE = re.compile(
    r"\b(?P<word>[Cc]hapters?)\s+(?P<nums>\d+(?:(?:\s*,\s*|\s+and\s+|\s+to\s+|-)\d+)*)\b")
NUMBER_RE = re.compile(r"\d+")
# an inline literal, ``...``, which reST shows verbatim (a :doc: role in it would show raw)
LITERAL_RE = re.compile(r"``.+?``")
COLAB_TITLE_RE = re.compile(r"^# ?@title\b[^\n]*\n?")
INLINE_MATH_RE = re.compile(r"\$([^$\n]+)\$")
# Characters of a signature that fit on one line of the API page's column at 1280 px.
SIGNATURE_LINE = 72


def chapter_docnames(toc: Path) -> dict[int, str]:
    """Chapter number -> docname (``book/05_splitting_heads``) from _toc.yml."""
    data = yaml.safe_load(toc.read_text(encoding="utf-8"))
    docnames: list[str] = []
    for part in data.get("parts", []):
        if part.get("numbered"):
            docnames += [str(Path(c["file"]).with_suffix("")) for c in part.get("chapters", [])]
    return {i + 1: name for i, name in enumerate(docnames)}


def link_chapters(line: str, docnames: dict[int, str], missing: list[int] | None = None) -> str:
    """Turn the chapter numbers of ``line`` into reST ``:doc:`` links.

    ``chapter 5`` -> ``:doc:`chapter 5 </book/05_x>```; ``chapters 5, 9`` ->
    ``chapters :doc:`5 </book/05_x>`, :doc:`9 </book/09_y>```. Numbers with no chapter
    stay as they are and are appended to ``missing``.
    """
    def one(number: str, title: str) -> str:
        name = docnames.get(int(number))
        if name is None:
            if missing is not None:
                missing.append(int(number))
            return title
        return f":doc:`{title} </{name}>`"

    def replace(match: re.Match) -> str:
        word, nums = match.group("word"), match.group("nums")
        numbers = NUMBER_RE.findall(nums)
        if len(numbers) == 1:
            return one(numbers[0], f"{word} {nums}")
        return f"{word} " + NUMBER_RE.sub(lambda m: one(m.group(), m.group()), nums)

    parts = LITERAL_RE.split(line)
    literals = LITERAL_RE.findall(line)
    out = [CHAPTERS_RE.sub(replace, parts[0])]
    for literal, part in zip(literals, parts[1:], strict=True):
        out += [literal, CHAPTERS_RE.sub(replace, part)]
    return "".join(out)


def link_docstring(lines: list[str], docnames: dict[int, str],
                   missing: list[int] | None = None) -> list[str]:
    """:func:`link_chapters` on each line of a docstring, except inside literal blocks
    (the indented lines after a paragraph ending in ``::``), shown verbatim too."""
    out: list[str] = []
    block_indent: int | None = None  # indent of the paragraph that opened a literal block
    for line in lines:
        indent = len(line) - len(line.lstrip())
        if block_indent is not None and line.strip():
            if indent > block_indent:
                out.append(line)
                continue
            block_indent = None
        if block_indent is not None:  # a blank line inside a block
            out.append(line)
            continue
        out.append(link_chapters(line, docnames, missing))
        if line.rstrip().endswith("::"):
            block_indent = indent
    return out


def _process_docstring(app: Sphinx, what: str, name: str, obj: object, options: object,
                       lines: list[str]) -> None:
    docnames = chapter_docnames(Path(app.confdir) / "_toc.yml")
    missing: list[int] = []
    lines[:] = link_docstring(lines, docnames, missing)
    for number in missing:
        logger.warning(f"{name}: docstring names chapter {number}, which _toc.yml "
                       "does not have", type="book_links", subtype="chapter")


def drop_colab_titles(doctree: nodes.document) -> int:
    """Remove the ``# @title ...`` first line of code blocks; return how many."""
    count = 0
    for block in doctree.findall(nodes.literal_block):
        text = block.astext()
        if not COLAB_TITLE_RE.match(text):
            continue
        new = COLAB_TITLE_RE.sub("", text, count=1)
        block.rawsource = new
        block.children = [nodes.Text(new)]
        count += 1
    return count


def _doctree_read(app: Sphinx, doctree: nodes.document) -> None:
    drop_colab_titles(doctree)


def typeset_citation_math(doctree: nodes.Element) -> int:
    """Replace ``$...$`` in the text of citations by math nodes; return how many."""
    count = 0
    for citation in list(doctree.findall(nodes.citation)):
        for text in list(citation.findall(nodes.Text)):
            parts = INLINE_MATH_RE.split(str(text))
            if len(parts) == 1 or isinstance(text.parent, (nodes.literal, nodes.math)):
                continue
            new: list[nodes.Node] = []
            for i, part in enumerate(parts):
                if i % 2:
                    new.append(nodes.math(part, part))
                    count += 1
                elif part:
                    new.append(nodes.Text(part))
            text.parent.replace(text, new)
    return count


class CitationMath(SphinxPostTransform):
    """:func:`typeset_citation_math`, after sphinxcontrib-bibtex's bibliography (3); on the
    bibliography page, each entry's "Cited in" line too (7)."""

    default_priority = 50

    def run(self, **kwargs: object) -> None:
        typeset_citation_math(self.document)
        if self.env.docname == BIBLIOGRAPHY_DOC and hasattr(self.app.builder, "get_relative_uri"):
            add_cited_in(self.document, self.app)


# --- 4. the book's form of a notebook ------------------------------------------------------

def _chapter_of(app: Sphinx, docname: str) -> int | None:
    numbers = {name: n for n, name in chapter_docnames(Path(app.confdir) / "_toc.yml").items()}
    return numbers.get(docname)


def _source_read(app: Sphinx, docname: str, source: list[str]) -> None:
    if not str(app.env.doc2path(docname)).endswith(".ipynb"):
        return
    nb = nbformat.reads(source[0], as_version=4)
    forms.stamp(nb, app.config.book_repository or None, _chapter_of(app, docname))
    source[0] = nbformat.writes(forms.to_myst(nb))


# --- 5. one repository setting ---------------------------------------------------------------

def _config_inited(app: Sphinx, config: object) -> None:
    repo = forms.repository()
    config.book_repository = repo or ""
    options = dict(config.html_theme_options or {})
    for key in ("repository_url", "repository_branch", "path_to_docs", "launch_buttons",
                "use_repository_button", "use_issues_button", "use_edit_page_button"):
        options.pop(key, None)
    if repo:
        options.update(repository_url=repo, repository_branch="main", path_to_docs="",
                       use_repository_button=True, launch_buttons={
                           "notebook_interface": "classic",
                           "binderhub_url": "https://mybinder.org",
                           "colab_url": "https://colab.research.google.com"})
    else:
        options.update(use_repository_button=False, launch_buttons={})
    config.html_theme_options = options
    # The API page: a signature longer than the text column holds on one line at 1280 px
    # is shown one parameter per line, not wrapped mid-way.
    if config.python_maximum_signature_line_length is None:
        config.python_maximum_signature_line_length = SIGNATURE_LINE


def _write_downloads(app: Sphinx, exception: Exception | None) -> None:
    """Replace each ``_sources/*.ipynb`` by the notebook made whole on its own."""
    if exception is not None or app.builder.format != "html":
        return
    repo = app.config.book_repository or None
    for docname in app.env.found_docs:
        path = Path(app.env.doc2path(docname))
        target = Path(app.outdir) / "_sources" / (docname + ".ipynb")
        if path.suffix != ".ipynb" or not target.exists():
            continue
        nb = nbformat.read(path, as_version=4)
        nbformat.write(forms.standalone(nb, repo, _chapter_of(app, docname)), target)


# --- 6. author-year citations on both sides --------------------------------------------------

def _register_citation_styles() -> None:
    import pybtex.plugin
    import sphinxcontrib.bibtex.plugin
    from pybtex.style.formatting.unsrt import Style as UnsrtStyle
    from pybtex.style.labels import BaseLabelStyle
    from pybtex.style.sorting.author_year_title import SortingStyle as AuthorYearTitleSorting
    from sphinxcontrib.bibtex.style.referencing import BracketStyle
    from sphinxcontrib.bibtex.style.referencing.author_year import AuthorYearReferenceStyle

    def round_brackets() -> BracketStyle:
        return BracketStyle(left="(", right=")", sep="; ", sep2="; ", last_sep="; ")

    @dataclass
    class RoundAuthorYear(AuthorYearReferenceStyle):
        """``(Vaswani et al., 2017)``, ``Vaswani et al. (2017)``; several joined by "; "."""

        bracket_parenthetical: BracketStyle = field(default_factory=round_brackets)
        bracket_textual: BracketStyle = field(default_factory=round_brackets)

    class AuthorYearLabels(BaseLabelStyle):
        def format_labels(self, sorted_entries):  # noqa: ANN001, ANN202
            for entry in sorted_entries:
                yield author_year_label(entry)

    class AuthorYearSorting(AuthorYearTitleSorting):
        """By the label a reader sees: :func:`entry_sort_key`."""

        def sorting_key(self, entry):  # noqa: ANN001, ANN202
            return entry_sort_key(entry)

    class AuthorYearStyle(UnsrtStyle):
        default_label_style = "author_year"
        default_sorting_style = "author_year_braces"

    pybtex.plugin.register_plugin("pybtex.style.labels", "author_year", AuthorYearLabels,
                                  force=True)
    pybtex.plugin.register_plugin("pybtex.style.sorting", "author_year_braces",
                                  AuthorYearSorting, force=True)
    pybtex.plugin.register_plugin("pybtex.style.formatting", "author_year", AuthorYearStyle,
                                  force=True)
    sphinxcontrib.bibtex.plugin.register_plugin("sphinxcontrib.bibtex.style.referencing",
                                                "author_year_round", RoundAuthorYear,
                                                force=True)


def sort_key(name: str) -> str:
    """A bibliography sort key: TeX braces dropped, lower case (``{Gemma Team}`` ->
    ``gemma team``)."""
    return re.sub(r"[{}]", "", name).lower()


def entry_sort_key(entry: object) -> tuple[str, str, str, str]:
    """The bibliography's order, the order of the labels a reader sees: the first
    author's last name (case-insensitive, blind to TeX braces, so ``{Gemma Team}`` sorts
    under G), then the year, then the rest of the label, then the title. So
    "Cho et al., 2014" comes before "Cho et al., 2024", and "Dao et al., 2022" before
    "Dao, 2024"."""
    label = author_year_label(entry)
    persons = entry.persons.get("author") or entry.persons.get("editor") or []
    first = " ".join(persons[0].prelast_names + persons[0].last_names) if persons else ""
    fields = entry.fields
    return (sort_key(first), str(fields.get("year", "")), sort_key(label),
            sort_key(str(fields.get("title", ""))))


def author_year_label(entry: object) -> str:
    """``Vaswani et al., 2017``: the first author's last name, ``and`` the second's for
    two, ``et al.`` for more; TeX braces dropped."""
    persons = entry.persons.get("author") or entry.persons.get("editor") or []
    last = [re.sub(r"[{}]", "", " ".join(p.last_names)) for p in persons]
    if len(last) > 2:
        names = f"{last[0]} et al."
    else:
        names = " and ".join(last)
    return f"{names}, {entry.fields.get('year', '')}"


# --- 7. where each work is cited ----------------------------------------------------------------

BIBLIOGRAPHY_DOC = "book/references"
CITE_ROLE_RE = re.compile(r"\{cite(?::\w+)?\}`(?P<keys>[^`]+)`")
REFERENCES_LINK_RE = re.compile(r"\]\((?:\./)?references\.md#(?P<key>[\w-]+)\)")


def toc_docnames(toc: Path) -> list[str]:
    """Every page of _toc.yml in reading order: the root, then each part's chapters."""
    data = yaml.safe_load(toc.read_text(encoding="utf-8"))
    names = [str(data["root"])]
    for part in data.get("parts", []):
        names += [str(Path(c["file"]).with_suffix("")) for c in part.get("chapters", [])]
    return names


def cited_keys(markdown: str) -> set[str]:
    """The BibTeX keys a page's Markdown cites: ``{cite:p}`` / ``{cite:t}`` roles and
    notebook citation links ``[Vaswani et al. (2017)](references.md#key)``."""
    keys = {k.strip() for m in CITE_ROLE_RE.finditer(markdown) for k in m["keys"].split(",")}
    return keys | {m["key"] for m in REFERENCES_LINK_RE.finditer(markdown)}


def citing_pages(root: Path) -> dict[str, list[str]]:
    """BibTeX key -> the pages (docnames, in reading order) whose text cites it, the
    bibliography page left out."""
    cited: dict[str, list[str]] = {}
    for name in toc_docnames(root / "_toc.yml"):
        if name == BIBLIOGRAPHY_DOC:
            continue
        for suffix in (".md", ".ipynb"):
            path = root / f"{name}{suffix}"
            if path.is_file():
                break
        else:
            continue
        if suffix == ".ipynb":
            nb = nbformat.read(path, as_version=4)
            text = "\n\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
        else:
            text = path.read_text(encoding="utf-8")
        for key in cited_keys(text):
            cited.setdefault(key, []).append(name)
    return cited


def page_label(docname: str, chapters: dict[str, int]) -> str:
    """``3`` for chapter 3, ``Appendix A``, ``Introduction``."""
    if docname in chapters:
        return str(chapters[docname])
    match = re.search(r"appendix_([a-z])_", docname)
    if match:
        return f"Appendix {match[1].upper()}"
    return "Introduction" if docname.endswith("intro") else docname.rsplit("/", 1)[-1]


def add_cited_in(doctree: nodes.document, app: Sphinx) -> int:
    """Append to each bibliography entry a line "Cited in: Introduction, chapters 3, 6,
    Appendix A", each a link, from the pages' real citations; return how many lines."""
    root = Path(app.confdir)
    cited = citing_pages(root)
    chapters = {name: n for n, name in chapter_docnames(root / "_toc.yml").items()}
    count = 0
    for citation in doctree.findall(nodes.citation):
        key = next((i for i in citation["ids"] if i in cited), None)
        if key is None:
            continue
        para = nodes.paragraph(classes=["cited-in"])
        para += nodes.emphasis(text="Cited in: ")
        numbered = [d for d in cited[key] if d in chapters]
        others = [d for d in cited[key] if d not in chapters]
        items: list[tuple[str, str]] = []  # (docname, link text)
        items += [(d, page_label(d, chapters)) for d in others if d.endswith("intro")]
        for i, d in enumerate(numbered):
            word = ("chapters " if len(numbered) > 1 else "chapter ") if i == 0 else ""
            items.append((d, word + str(chapters[d])))
        items += [(d, page_label(d, chapters)) for d in others if not d.endswith("intro")]
        for i, (docname, label) in enumerate(items):
            if i:
                para += nodes.Text(", ")
            uri = app.builder.get_relative_uri(BIBLIOGRAPHY_DOC, docname)
            para += nodes.reference("", label, internal=True, refuri=uri)
        para += nodes.Text(".")
        citation += para
        count += 1
    return count


def setup(app: Sphinx) -> dict:
    # The API page's overview tables ("At a glance": each name and the first line of its
    # docstring); no stub pages are generated (no :toctree:).
    app.setup_extension("sphinx.ext.autosummary")
    _register_citation_styles()
    app.add_config_value("book_repository", "", "env")
    app.connect("config-inited", _config_inited)
    app.connect("source-read", _source_read)
    app.connect("build-finished", _write_downloads)
    app.connect("autodoc-process-docstring", _process_docstring)
    app.connect("doctree-read", _doctree_read)
    app.add_post_transform(CitationMath)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
