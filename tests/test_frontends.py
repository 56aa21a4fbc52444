"""A chapter reads well outside the HTML book: rendered by plain ``nbconvert`` (what a
Jupyter without a MyST renderer, or a notebook viewer, shows), in Chromium at 1280 px.

No raw MyST syntax (directive fences, roles, option lines) may be visible; exercises and
solutions read as headings and text; the library's source shows as highlighted code; the
figures embedded in the notebook load. (``make test-jupyterlab`` checks JupyterLab with
its MyST renderer; see ``tests/test_jupyterlab.py``.)
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

from tests import chromium, front_matter

pytestmark = pytest.mark.browser
RAW = re.compile(r"```|\{(exercise|solution-start|solution-end|literalinclude|cite:[pt]|"
                 r"note|warning|dropdown)\}|^:(label|class|pyobject|language):", re.MULTILINE)
CHAPTERS = ["08_multi_head_attention.ipynb", "16_rotary.ipynb"]


@pytest.fixture(scope="module")
def page() -> Iterator[object]:
    chromium.require()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = chromium.launch(pw)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        context.route("**/*", lambda route, request: route.continue_()
                      if request.url.startswith(("file:", "data:", "blob:")) else route.abort())
        try:
            yield context.new_page()
        finally:
            browser.close()


def _render(name: str, folder: Path) -> Path:
    from nbconvert import HTMLExporter

    nb = nbformat.read(front_matter.BOOK / name, as_version=4)
    html, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
    out = folder / name.replace(".ipynb", ".html")
    out.write_text(html, encoding="utf-8")
    return out


@pytest.mark.parametrize("name", CHAPTERS)
def test_nbconvert_shows_no_raw_myst(name: str, page: object, tmp_path: Path) -> None:
    page.goto(_render(name, tmp_path).as_uri())
    text = page.evaluate("() => document.body.innerText")
    raw = sorted({m.group(0) for m in RAW.finditer(text)})
    assert not raw, f"{name}: raw MyST syntax visible with plain nbconvert: {raw}"
    number = int(name[:2])
    assert f"Exercise {number}.1:" in text and f"Solution to Exercise {number}.1" in text
    codes = page.evaluate(
        "() => [...document.querySelectorAll('.jp-RenderedMarkdown pre, "
        ".jp-RenderedHTMLCommon pre')].map(p => p.innerText)")
    shown = re.compile(r"^\s*def (forward|__init__|apply_rotary)\(", re.MULTILINE)
    assert any(shown.search(c) for c in codes), (
        f"{name}: the library's source is not shown as code")
    images = page.evaluate(
        "() => [...document.images].map(i => [i.alt.slice(0, 40), i.naturalWidth])")
    assert all(width > 0 for _, width in images), f"{name}: an image did not load: {images}"
    if number <= 11:
        assert any(alt.startswith("Where chapter") for alt, _ in images), images


def test_the_raw_pattern_finds_planted_syntax() -> None:
    for raw in ("```{exercise} One", ":label: ex-08-a", "see {cite:p}", "```python"):
        assert RAW.search(raw), raw
    assert not RAW.search("Exercise 8.1: Concatenate\nSolution to Exercise 8.1")
