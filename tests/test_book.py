"""The book builds strictly (`jupyter-book build . -W -n --keep-going --all`, zero warnings)
and every page of _toc.yml comes out as HTML."""

from __future__ import annotations

import inspect
import posixpath
import re
from pathlib import Path

import pytest
import torch
from bs4 import BeautifulSoup  # ships with the book's theme (pydata-sphinx-theme)

import mha_lib

pytestmark = pytest.mark.book

# MyST/rST directives that pull documentation out of mha_lib's docstrings.
REPO = Path(__file__).resolve().parent.parent
AUTODOC_DIRECTIVE = re.compile(r"(\{|\.\. )auto(module|class|function|method|attribute|data)\b")


def source_of(docname: str) -> Path | None:
    for suffix in (".md", ".ipynb", ".rst"):
        path = REPO / f"{docname}{suffix}"
        if path.is_file():
            return path
    return None


def test_strict_build_has_zero_warnings(built_book: Path) -> None:
    # The fixture already failed the test (with the log) on a warning or an error.
    assert (built_book / "index.html").is_file()


def test_every_toc_page_has_a_source(toc_pages: list[str]) -> None:
    missing = [name for name in toc_pages if source_of(name) is None]
    assert not missing, f"_toc.yml lists pages with no .md/.ipynb source: {missing}"


def test_every_toc_page_has_html(built_book: Path, toc_pages: list[str]) -> None:
    missing = [f"{name}.html" for name in toc_pages if not (built_book / f"{name}.html").is_file()]
    assert not missing, f"pages in _toc.yml with no HTML in {built_book}: {missing}"


def test_index_redirects_to_root_page(built_book: Path, toc_pages: list[str]) -> None:
    index = (built_book / "index.html").read_text(encoding="utf-8")
    assert f"{toc_pages[0]}.html" in index, (
        f"index.html does not point at the root page {toc_pages[0]}.html"
    )


def test_api_pages_document_mha_lib(built_book: Path, toc_pages: list[str]) -> None:
    """Pages that use autodoc show real API entries (a failed import would leave none)."""
    api_pages = [
        name for name in toc_pages
        if (src := source_of(name)) and AUTODOC_DIRECTIVE.search(src.read_text(encoding="utf-8"))
    ]
    if not api_pages:
        pytest.skip("no page in _toc.yml uses autodoc yet")
    for name in api_pages:
        html = (built_book / f"{name}.html").read_text(encoding="utf-8")
        entries = re.findall(r'<dt class="sig sig-object py" id="(mha_lib\.[^"]+)"', html)
        assert entries, f"{name}.html uses autodoc but documents no mha_lib object"


# --- API reference ----------------------------------------------------------------------

API_PAGE = "book/appendix_b_api"


def _soup(path: Path) -> BeautifulSoup:
    return BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser")


def _header_soup(html: str) -> BeautifulSoup:
    """The page's header only (its buttons): the article, with its embedded figures, is
    most of a page's bytes and takes most of the time to parse."""
    end = html.find("<article")
    return BeautifulSoup(html[:end] if end > 0 else html, "html.parser")


def _public_names() -> list[str]:
    return list(mha_lib.__all__)


@pytest.fixture(scope="module")
def api_soup(built_book: Path, toc_pages: list[str]) -> BeautifulSoup:
    assert API_PAGE in toc_pages, f"the API reference {API_PAGE} is not in _toc.yml"
    return _soup(built_book / f"{API_PAGE}.html")


def _params(obj: object) -> list[str]:
    """The parameters a rendered signature shows (classes: __init__'s, without self)."""
    return [name for name in inspect.signature(obj).parameters if name != "self"]


@pytest.mark.parametrize("name", _public_names())
def test_api_page_documents_every_public_name(api_soup: BeautifulSoup, name: str) -> None:
    """`mha_lib.<name>` has an autodoc entry with a rendered signature and a docstring."""
    obj = getattr(mha_lib, name)
    dt = api_soup.find("dt", id=f"mha_lib.{name}")
    assert dt is not None, (
        f"mha_lib.{name} is in mha_lib.__all__ but not documented in {API_PAGE}.md "
        f"(add `.. autofunction:: mha_lib.{name}` or `.. autoclass::` there)")
    assert "sig" in dt.get("class", []), f"mha_lib.{name}: not a rendered signature: {dt}"
    sig_name = dt.select_one("span.sig-name")
    assert sig_name is not None and sig_name.get_text(strip=True) == name
    # A rendered signature has its parentheses and one <em class="sig-param"> per parameter.
    assert len(dt.select("span.sig-paren")) == 2, f"mha_lib.{name}: signature has no (...)"
    shown = [em.select_one("span.n").get_text(strip=True) if em.select_one("span.n")
             else em.get_text(strip=True) for em in dt.select("em.sig-param")]
    shown = [p for p in shown if p not in ("*", "/")]
    assert shown == _params(obj), f"mha_lib.{name}: signature shows {shown}"
    dd = dt.find_next_sibling("dd")
    assert dd is not None and len(dd.get_text(strip=True)) > 20, (
        f"mha_lib.{name}: no docstring on the API page")


@pytest.mark.parametrize("name", [n for n in _public_names() if n[0].isupper()])
def test_api_page_documents_forward_of_every_module(api_soup: BeautifulSoup, name: str) -> None:
    """nn.Module classes show the `forward` they define with its signature (the call readers
    make); a subclass that inherits it from another mha_lib class is documented there."""
    obj = getattr(mha_lib, name)
    if not (isinstance(obj, type) and issubclass(obj, torch.nn.Module)):
        pytest.skip(f"{name} is not an nn.Module")
    if "forward" not in vars(obj):
        pytest.skip(f"{name} inherits forward from {obj.__mro__[1].__name__}")
    dt = api_soup.find("dt", id=f"mha_lib.{name}.forward")
    assert dt is not None, (
        f"mha_lib.{name}.forward is not documented in {API_PAGE}.md "
        "(add `:members: forward` and `:undoc-members:` under its autoclass)")
    shown = [em.select_one("span.n").get_text(strip=True) for em in dt.select("em.sig-param")
             if em.select_one("span.n")]
    assert shown == _params(obj.forward), f"{name}.forward signature shows {shown}"


def test_api_page_has_no_unrendered_directives(api_soup: BeautifulSoup) -> None:
    text = api_soup.select_one("article, main, body").get_text(" ")
    leaked = re.findall(r"(?:\.\. |\{)(?:auto\w+|eval-rst)\b[^\n]{0,60}", text)
    assert not leaked, f"directives shown as text on {API_PAGE}: {leaked}"


# --- launch and download buttons ----------------------------------------------------------

def _notebook_pages(toc_pages: list[str]) -> list[str]:
    return [n for n in toc_pages if (src := source_of(n)) is not None and src.suffix == ".ipynb"]


PLACEHOLDERS = re.compile(r"your-org|mha-step-by-step|owner/name|example-owner",
                          re.IGNORECASE)
LAUNCH_HOSTS = ("github.com/", "colab.research", "mybinder", "binder")


def test_unpublished_book_has_no_repository_or_launch_links(
        built_book: Path, toc_pages: list[str]) -> None:
    """With no repository set, no page links a repository, Colab or Binder, nor any
    placeholder; every notebook page still offers its .ipynb, made whole on its own."""
    pages = _notebook_pages(toc_pages)
    assert len(pages) >= 18, f"expected the chapter notebooks among {toc_pages}"
    problems = []
    for name in toc_pages:
        html = (built_book / f"{name}.html").read_text(encoding="utf-8")
        if PLACEHOLDERS.search(html):
            problems.append(f"{name}.html: a placeholder: {PLACEHOLDERS.search(html).group(0)}")
        soup = _header_soup(html)
        for a in soup.select(".article-header-buttons a[href], .header-article-items a[href]"):
            if any(host in a["href"] for host in LAUNCH_HOSTS):
                problems.append(f"{name}.html: a launch/repository button: {a['href']}")
    for name in pages:
        soup = _header_soup((built_book / f"{name}.html").read_text(encoding="utf-8"))
        downloads = [a["href"] for a in soup.select("a.btn-download-source-button[href]")]
        if not any(d.endswith(f"_sources/{name}.ipynb") for d in downloads):
            problems.append(f"{name}.html: no .ipynb download button (found {downloads})")
            continue
        built = (built_book / "_sources" / f"{name}.ipynb").read_text(encoding="utf-8")
        if PLACEHOLDERS.search(built) or '"repository": ""' not in built:
            problems.append(f"{name}.ipynb: the download is not the unpublished notebook")
    assert not problems, "\n".join(problems)


def test_placeholder_check_finds_a_planted_placeholder() -> None:
    assert PLACEHOLDERS.search('<a href="https://github.com/your-org/mha-step-by-step">')
    assert not PLACEHOLDERS.search('<a href="https://github.com/torvalds/linux">')


def test_published_book_links_its_repository(published_book: Path) -> None:
    """With BOOK_REPOSITORY set, every notebook page has the repository, Colab and Binder
    buttons for it, no link to any other repository, and a download whose set-up cell and
    links point at it and at the published book."""
    from tests.conftest import PUBLISHED_PAGES, PUBLISHED_REPOSITORY
    owner_repo = PUBLISHED_REPOSITORY.removeprefix("https://github.com/")
    problems = []
    for name in PUBLISHED_PAGES[1:]:
        soup = _soup(published_book / f"{name}.html")
        hrefs = [a["href"] for a in soup.select("a[href]")]
        want = {
            "Colab": f"https://colab.research.google.com/github/{owner_repo}/blob/main/"
                     f"{name}.ipynb",
            "Binder": f"https://mybinder.org/v2/gh/{owner_repo}/main?urlpath=tree/{name}.ipynb",
            "repository": PUBLISHED_REPOSITORY,
        }
        for what, url in want.items():
            if url not in hrefs:
                problems.append(f"{name}.html: no {what} button to {url}")
        for href in hrefs:
            if any(h in href for h in LAUNCH_HOSTS[:3]) and owner_repo not in href \
                    and "github.com/" in href and "/blob/" in href:
                problems.append(f"{name}.html: launch/repository link elsewhere: {href}")
        copy = (published_book / "_sources" / f"{name}.ipynb").read_text(encoding="utf-8")
        if f'REPOSITORY = \\"{PUBLISHED_REPOSITORY}\\"' not in copy:
            problems.append(f"{name}.ipynb: the download's set-up cell does not install from "
                            f"{PUBLISHED_REPOSITORY}")
        if "your-org" in copy:
            problems.append(f"{name}.ipynb: a placeholder in the download")
    intro = (published_book / "book" / "intro.html").read_text(encoding="utf-8")
    assert "your-org" not in intro
    assert not problems, "\n".join(problems)


def test_landing_page_links_every_page(built_book: Path, toc_pages: list[str]) -> None:
    """The roadmap on the root page links every page of the book (chapters, appendices)."""
    root = toc_pages[0]
    soup = _soup(built_book / f"{root}.html")
    article = soup.select_one("article") or soup
    root_dir = posixpath.dirname(root)
    linked = set()
    for a in article.select("a[href]"):
        href = a["href"].split("#")[0]
        if href.endswith(".html") and "://" not in href:
            linked.add(posixpath.normpath(posixpath.join(root_dir, href)).removesuffix(".html"))
    missing = [n for n in toc_pages[1:] if n not in linked]
    assert not missing, f"{root} does not link these pages of _toc.yml: {missing}"


def test_landing_page_states_the_pinned_torch() -> None:
    """The introduction says which torch the outputs were verified with: the pinned one."""
    pins = re.findall(r"^torch==([\w.+]+)\s*$", (REPO / "requirements.txt").read_text(),
                      re.MULTILINE)
    assert len(pins) == 1, f"requirements.txt should pin torch exactly once, found {pins}"
    intro = (REPO / "book" / "intro.md").read_text(encoding="utf-8")
    assert f"torch {pins[0]}" in intro, f"book/intro.md does not name torch {pins[0]}"


def test_api_page_links_the_chapters_docstrings_name(api_soup: BeautifulSoup,
                                                     toc_pages: list[str]) -> None:
    """"Derived in chapter N" in a docstring is a link to chapter N (_ext/book_links.py)."""
    links = [a for a in api_soup.select("article a[href]")
             if re.fullmatch(r"[Cc]hapters? \d+|\d+", a.get_text(strip=True))]
    assert len(links) >= 15, f"only {len(links)} chapter links on the API page"
    for a in links:
        number = int(re.search(r"\d+", a.get_text()).group())
        target = a["href"].split("#")[0]
        assert re.fullmatch(rf"{number:02d}_\w+\.html", target), (a.get_text(), target)
    unlinked = [str(t).strip() for dd in api_soup.select("dl.py dd")
                for t in dd.find_all(string=re.compile(r"\b[Cc]hapters?\s+\d"))
                if t.find_parent("a") is None and t.find_parent("pre") is None]
    assert not unlinked, f"chapter numbers left without a link: {unlinked}"


def _described_parameters(dd) -> set[str]:
    """Parameter names whose entry in the "Parameters" field list has a description
    (text after the dash), not only the type that autodoc_typehints adds by itself."""
    described = set()
    for strong in dd.select("dl.field-list strong"):
        entry = strong.find_parent("p") or strong.parent
        text = entry.get_text(" ", strip=True)
        if "\u2013" in text and len(text.split("\u2013", 1)[1].strip()) > 3:
            described.add(strong.get_text(strip=True))
    return described


def test_api_page_shows_a_description_of_every_parameter(api_soup: BeautifulSoup) -> None:
    """Every public function and class of mha_lib (and every forward) has each of its
    parameters described ("Args:" in the docstring)."""
    missing = []
    for name in _public_names():
        obj = getattr(mha_lib, name)
        targets = [(name, obj)]
        if isinstance(obj, type) and "forward" in vars(obj):
            targets.append((f"{name}.forward", obj.forward))
        for target, fn in targets:
            dt = api_soup.find("dt", id=f"mha_lib.{target}")
            if dt is None:
                continue  # a missing entry fails test_api_page_documents_every_public_name
            described = _described_parameters(dt.find_next_sibling("dd"))
            missing += [f"{target}({p})" for p in _params(fn) if p not in described]
    assert not missing, f"parameters without a description on the API page: {missing}"


def test_api_page_documents_the_benchmark_functions_and_lists_the_tools(
        api_soup: BeautifulSoup) -> None:
    """The functions chapters call (bench.benchmark, CombinedQKV, ...) are documented; the
    command-line entry points are tools, listed with their --help, not API entries."""
    assert api_soup.find(id="tools") is not None
    assert api_soup.find("dt", id="mha_lib.bench.benchmark") is not None
    assert api_soup.find("dt", id="mha_lib.bench.main") is None
    assert "python -m mha_lib.bench --help" in api_soup.get_text()


def test_colab_titles_stay_out_of_the_book(built_book: Path, toc_pages: list[str]) -> None:
    """Solution cells start with "# @title ..." for Colab's form view; the book drops it."""
    leaked = [name for name in _notebook_pages(toc_pages)
              if "@title" in (built_book / f"{name}.html").read_text(encoding="utf-8")]
    assert not leaked, f"'# @title' lines shown in {leaked}"
