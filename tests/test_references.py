"""Every entry of book/references.bib is cited by some page, and listed by topic.

The bibliography page prints every entry (``{bibliography}`` with ``:all:``), so an entry
that no page cites would sit there unexplained. This reads the pages as they are when
it runs: the notebooks' citation links (``[Vaswani et al. (2017)](references.md#key)``,
see ``_ext/notebook_forms.py``) and the MyST pages' ``{cite:p}`` / ``{cite:t}`` roles,
of every page in _toc.yml except the bibliography itself; and references.md's topic
sections, which must give each entry a line saying what it is used for.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
from pybtex.database import BibliographyData, parse_file, parse_string

from tests import front_matter
from tests.conftest import REPO, toc_docnames

forms = front_matter.forms
BIB_PATH = REPO / "book" / "references.bib"
REFERENCES = "book/references"
CITE_ROLE_RE = re.compile(r"\{cite(?::\w+)?\}`(?P<keys>[^`]+)`")
MD_LINK_RE = re.compile(r"\]\((?:\./)?references\.md#(?P<key>[\w-]+)\)")
BIBLIOGRAPHY_RE = re.compile(r"```\{bibliography\}.*?```", re.DOTALL)


def cited_keys(source: str) -> set[str]:
    """Keys a page's Markdown cites, as a role or as a link to the bibliography."""
    keys = {k.strip() for m in CITE_ROLE_RE.finditer(source) for k in m["keys"].split(",")}
    keys |= {k for _, _, k in forms.citations(source)}
    keys |= {m["key"] for m in MD_LINK_RE.finditer(source)}
    return keys


def page_markdown(path: Path) -> str:
    if path.suffix == ".ipynb":
        nb = nbformat.read(path, as_version=4)
        return "\n\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    return path.read_text(encoding="utf-8")


def citing_pages(docnames: list[str]) -> dict[str, set[str]]:
    """Key -> the pages (docnames) that cite it, the bibliography page left out."""
    cited: dict[str, set[str]] = {}
    for name in docnames:
        if name == REFERENCES:
            continue
        path = next((REPO / f"{name}{s}" for s in (".md", ".ipynb")
                     if (REPO / f"{name}{s}").is_file()), None)
        if path is None:
            continue  # test_book.py reports a page with no source
        for key in cited_keys(page_markdown(path)):
            cited.setdefault(key, set()).add(name)
    return cited


def uncited(bib: BibliographyData, cited: dict[str, set[str]]) -> list[str]:
    return [key for key in bib.entries if key not in cited]


def topic_keys(references_md: str) -> set[str]:
    """The keys references.md's topic sections cite (the full list left out)."""
    return cited_keys(BIBLIOGRAPHY_RE.sub("", references_md))


def test_every_entry_is_cited_by_a_page() -> None:
    bib = parse_file(BIB_PATH)
    missing = uncited(bib, citing_pages(toc_docnames()))
    assert not missing, (
        f"references.bib has entries no page cites: {missing}. Cite each where the page "
        "relies on it, or remove it from references.bib and references.md")


def test_every_cited_key_is_in_the_bibliography() -> None:
    bib = parse_file(BIB_PATH)
    unknown = {key: sorted(pages) for key, pages in citing_pages(toc_docnames()).items()
               if key not in bib.entries}
    assert not unknown, f"pages cite keys that references.bib lacks: {unknown}"


def test_every_entry_has_a_line_in_a_topic_section() -> None:
    bib = parse_file(BIB_PATH)
    text = (REPO / f"{REFERENCES}.md").read_text(encoding="utf-8")
    assert BIBLIOGRAPHY_RE.search(text), "references.md has no {bibliography} block"
    missing = [key for key in bib.entries if key not in topic_keys(text)]
    assert not missing, (
        f"references.md's topic sections do not mention {missing}: add a line saying "
        "what each is used for, and where")


def test_a_planted_uncited_entry_is_found() -> None:
    """An entry added to the real bibliography, cited nowhere, is reported; a citation of
    it in a page (either form) clears it."""
    planted = parse_string(
        "@misc{nobody2099planted, title = {Planted}, author = {Nobody, A.}, year = {2099}}",
        "bibtex")
    bib = parse_file(BIB_PATH)
    bib.add_entry("nobody2099planted", planted.entries["nobody2099planted"])
    cited = citing_pages(toc_docnames())
    assert "nobody2099planted" in uncited(bib, cited)
    assert "vaswani2017attention" not in uncited(bib, cited)
    for source in ("Planted ([Nobody, 2099](references.md#nobody2099planted)).",
                   "As {cite:t}`vaswani2017attention,nobody2099planted` show."):
        assert "nobody2099planted" in cited_keys(source)
    text = (REPO / f"{REFERENCES}.md").read_text(encoding="utf-8")
    assert "nobody2099planted" not in topic_keys(text)
    assert "nobody2099planted" in topic_keys(text + "\n* {cite:t}`nobody2099planted`\n")


# --- year letters: "Liu et al., 2020a" and "2020b" ------------------------------------------

def year_letter_problems(bib: BibliographyData) -> list[str]:
    """Entries whose year letter is wrong. The letters are typed in references.bib
    (``year = {2020a}``); entries whose labels would otherwise print alike must take
    a, b, ... in order of publication (read from their arXiv numbers), and no other
    entry may take one."""
    import sys
    sys.path.insert(0, str(REPO / "_ext"))
    from book_links import author_year_label

    groups: dict[str, list[tuple[str, str, str]]] = {}
    for key, entry in bib.entries.items():
        label = author_year_label(entry)  # "Liu et al., 2020a"
        base = re.sub(r"(\d{4})[a-z]$", r"\1", label)
        arxiv = re.search(r"arxiv\.org/abs/(\d{4}\.\d{4,5})",
                          entry.fields.get("url", ""))
        groups.setdefault(base, []).append(
            (arxiv[1] if arxiv else "", key, label))
    problems = []
    for base, members in groups.items():
        if len(members) == 1:
            letters = [""]
        else:
            assert all(m[0] for m in members), (
                f"{base}: entries without an arXiv number to order them by")
            letters = "abcdefghij"[:len(members)]
        for (_, key, label), letter in zip(sorted(members), letters,
                                              strict=True):
            if label != base + letter:
                problems.append(f"{key}: {label}, not {base + letter}")
    return problems


def test_year_letters_follow_the_order_of_publication() -> None:
    assert not year_letter_problems(parse_file(BIB_PATH))


def test_a_swapped_year_letter_is_found() -> None:
    bib = parse_file(BIB_PATH)
    bib.entries["touvron2023llama"].fields["year"] = "2023b"
    bib.entries["touvron2023llama2"].fields["year"] = "2023a"
    assert sorted(year_letter_problems(bib)) == [
        "touvron2023llama2: Touvron et al., 2023a, not Touvron et al., 2023b",
        "touvron2023llama: Touvron et al., 2023b, not Touvron et al., 2023a"]
    bib = parse_file(BIB_PATH)
    bib.entries["vaswani2017attention"].fields["year"] = "2017a"
    assert year_letter_problems(bib) == [
        "vaswani2017attention: Vaswani et al., 2017a, not Vaswani et al., 2017"]
