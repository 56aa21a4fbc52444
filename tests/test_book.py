"""The book builds strictly (`jupyter-book build . -W -n --keep-going --all`, zero warnings)
and every page of _toc.yml comes out as HTML."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

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
