"""The local Sphinx extension _ext/book_links.py: "chapter N" in docstrings becomes a link
to chapter N (numbered as _toc.yml numbers it), and Colab's "# @title" line of solution
cells stays out of the book. The built API page is checked in tests/test_book.py."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from docutils import nodes
from docutils.utils import new_document

REPO = Path(__file__).resolve().parent.parent


def _load():
    # as in the build, where Sphinx puts _ext/ on sys.path (book_links imports notebook_forms)
    if str(REPO / "_ext") not in sys.path:
        sys.path.insert(0, str(REPO / "_ext"))
    spec = importlib.util.spec_from_file_location("book_links", REPO / "_ext" / "book_links.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


book_links = _load()
DOCS = {1: "book/01_a", 5: "book/05_b", 8: "book/08_c", 9: "book/09_d", 13: "book/13_e"}


def test_chapter_numbers_follow_the_toc_files() -> None:
    docnames = book_links.chapter_docnames(REPO / "_toc.yml")
    assert docnames[1] == "book/01_tokenization"
    # Jupyter Book numbers on across parts: chapter N is book/NN_*.ipynb
    for number, name in docnames.items():
        assert Path(name).name.startswith(f"{number:02d}_"), (number, name)


@pytest.mark.parametrize("line, linked", [
    ("Derived in chapter 5.", "Derived in :doc:`chapter 5 </book/05_b>`."),
    ("(chapter 13)", "(:doc:`chapter 13 </book/13_e>`)"),
    ("Chapter 1 shows it.", ":doc:`Chapter 1 </book/01_a>` shows it."),
    ("(chapters 5, 9)", "(chapters :doc:`5 </book/05_b>`, :doc:`9 </book/09_d>`)"),
    ("chapters 5 and 8", "chapters :doc:`5 </book/05_b>` and :doc:`8 </book/08_c>`"),
    ("Derived in chapter 5, used in chapter 8.",
     "Derived in :doc:`chapter 5 </book/05_b>`, used in :doc:`chapter 8 </book/08_c>`."),
    ("no chapter here; chapterless", "no chapter here; chapterless"),
])
def test_chapter_numbers_become_links(line: str, linked: str) -> None:
    assert book_links.link_chapters(line, DOCS) == linked


def test_a_chapter_that_does_not_exist_is_reported() -> None:
    missing: list[int] = []
    assert book_links.link_chapters("see chapter 42", DOCS, missing) == "see chapter 42"
    assert missing == [42]


def test_colab_title_line_is_dropped_from_code_blocks() -> None:
    doc = new_document("test")
    title = "# @title Solution to Exercise 6.1 (code folded: open it to read)\n"
    doc += nodes.literal_block(title + "x = 1", title + "x = 1")
    doc += nodes.literal_block("# a comment\nx = 2", "# a comment\nx = 2")
    assert book_links.drop_colab_titles(doc) == 1
    blocks = list(doc.findall(nodes.literal_block))
    assert [b.astext() for b in blocks] == ["x = 1", "# a comment\nx = 2"]
    assert blocks[0].rawsource == "x = 1"


def test_tex_math_in_a_citation_becomes_a_math_node() -> None:
    doc = new_document("test")
    citation = nodes.citation()
    citation += nodes.paragraph("", "", nodes.Text("Self-attention does not need $O(n^2)$ memory."))
    doc += citation
    assert book_links.typeset_citation_math(doc) == 1
    paragraph = next(doc.findall(nodes.paragraph))
    assert [type(n).__name__ for n in paragraph.children] == ["Text", "math", "Text"]
    assert paragraph.children[1].astext() == "O(n^2)"


def test_bibliography_sorts_without_case_or_braces() -> None:
    """Corporate authors written ``{{Gemma Team}}`` sort under G, ``{bloc97}`` under B."""
    import pybtex.plugin
    from pybtex.database import parse_string

    book_links._register_citation_styles()
    bib = parse_string(
        "@misc{z, author = {Zhang, Aston}, title = {Z}, year = {2023}}\n"
        "@misc{g, author = {{Gemma Team}}, title = {G}, year = {2024}}\n"
        "@misc{b, author = {{bloc97}}, title = {B}, year = {2023}}\n"
        "@misc{d, author = {{DeepSeek-AI}}, title = {D}, year = {2024}}\n"
        "@misc{v, author = {Vaswani, Ashish}, title = {V}, year = {2017}}\n", "bibtex")
    style = pybtex.plugin.find_plugin("pybtex.style.formatting", "author_year")()
    order = [e.key for e in style.sort(bib.entries.values())]
    assert order == ["b", "d", "g", "v", "z"], order


def test_cited_in_lists_the_pages_that_cite_an_entry() -> None:
    """Every entry's "Cited in" comes from the pages' real citations, in reading order."""
    cited = book_links.citing_pages(REPO)
    assert "book/references" not in {d for docs in cited.values() for d in docs}
    assert cited["vaswani2017attention"][0] == "book/intro"
    text = "As [Vaswani et al. (2017)](references.md#vaswani2017attention) and " \
           "{cite:p}`he2016deep,ba2016layer` show."
    assert book_links.cited_keys(text) == {"vaswani2017attention", "he2016deep",
                                           "ba2016layer"}
    chapters = {"book/05_b": 5}
    assert book_links.page_label("book/appendix_a_masks", chapters) == "Appendix A"
    assert book_links.page_label("book/intro", chapters) == "Introduction"
    assert book_links.page_label("book/05_b", chapters) == "5"


@pytest.mark.parametrize("line, linked", [
    # reST shows an inline literal verbatim: a link there would show as raw ":doc:`...`"
    ("``\"see 'Why' in chapter 5\"``", "``\"see 'Why' in chapter 5\"``"),
    ("in chapter 5 (``chapter 8``), chapter 9",
     "in :doc:`chapter 5 </book/05_b>` (``chapter 8``), :doc:`chapter 9 </book/09_d>`"),
])
def test_inline_literals_stay_as_they_are(line: str, linked: str) -> None:
    assert book_links.link_chapters(line, DOCS) == linked


def test_literal_blocks_stay_as_they_are() -> None:
    lines = ["Derived in chapter 5. Usage::", "", "    check(x)  # chapter 8", "",
             "Then chapter 9."]
    assert book_links.link_docstring(lines, DOCS) == [
        "Derived in :doc:`chapter 5 </book/05_b>`. Usage::", "",
        "    check(x)  # chapter 8", "", "Then :doc:`chapter 9 </book/09_d>`."]


def test_bibliography_sorts_by_label_then_year() -> None:
    """Within one surname the labels read in order of year: "Cho et al., 2014" before
    "Cho et al., 2024" (whose first author's given names would put it first), "Dao et al.,
    2022" before "Dao, 2024", "Press and Wolf, 2017" before "Press et al., 2022"."""
    import pybtex.plugin
    from pybtex.database import parse_string

    book_links._register_citation_styles()
    bib = parse_string(
        "@misc{cho24, author = {Cho, Aeree and Kim, G. and Karpekov, A.}, title = {T},"
        " year = {2024}}\n"
        "@misc{cho14, author = {Cho, Kyunghyun and van Merrienboer, B. and Gulcehre, C.},"
        " title = {L}, year = {2014}}\n"
        "@misc{dao24, author = {Dao, Tri}, title = {F2}, year = {2024}}\n"
        "@misc{dao22, author = {Dao, Tri and Fu, D. and Ermon, S.}, title = {F},"
        " year = {2022}}\n"
        "@misc{press22, author = {Press, Ofir and Smith, N. and Lewis, M.}, title = {A},"
        " year = {2022}}\n"
        "@misc{press17, author = {Press, Ofir and Wolf, Lior}, title = {U}, year = {2017}}\n",
        "bibtex")
    style = pybtex.plugin.find_plugin("pybtex.style.formatting", "author_year")()
    order = [e.key for e in style.sort(bib.entries.values())]
    assert order == ["cho14", "cho24", "dao22", "dao24", "press17", "press22"], order
