"""The built book, opened in a real browser (Debian's Chromium via Playwright), offline.

The HTML is served on 127.0.0.1 (random free port); every request that is not to
127.0.0.1/localhost is aborted and recorded. Every HTML page of the build (the _toc.yml
pages, genindex, search, _modules/..., and whatever they link to) is loaded once (of
viewcode's ~40 source pages, one template, a sample; the rest are read from disk for
their links and ids) and checked for: JavaScript errors, broken images, MathJax
rendering, broken internal links and anchors, and requests that would leave the
machine. Pages added to _toc.yml later are covered without changing this file.
Then the search page must find "attention", and a screenshot of the first chapter is
written to _build/screenshots/chapter1.png.
"""

from __future__ import annotations

import functools
import http.server
import json
import posixpath
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urldefrag, urljoin, urlsplit

import pytest

from tests import chromium

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parent.parent
SCREENSHOT = REPO / "_build" / "screenshots" / "chapter1.png"
LOCAL_HOSTS = {"127.0.0.1", "localhost"}
# Jupyter Book's index.html is only a <meta http-equiv="Refresh"> to the root page.
META_REFRESH = re.compile(
    r"""<meta[^>]+http-equiv=["']?refresh["']?[^>]+content=["']?\d+\s*;\s*url=([^"'>\s]+)""",
    re.IGNORECASE,
)
MATHJAX_TIMEOUT_MS = 30_000
SEARCH_TIMEOUT_MS = 30_000


# Hidden/code text is not prose: raw TeX there is intended (e.g. a code cell printing "$$").
# Flagged in visible prose: $$, \( \) \[ \], \begin{, a $...$ pair around non-blank text,
# and common TeX commands, each a sign that math was not typeset.
VISIBLE_PROSE_TEXT_JS = r"""
() => {
  const skip = "PRE, CODE, SCRIPT, STYLE, TEXTAREA, NOSCRIPT, MJX-CONTAINER, "
             + "MJX-ASSISTIVE-MML, MATH";
  const out = [];
  const root = document.body || document.documentElement;
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const el = n.parentElement;
    if (!el || el.closest(skip)) continue;
    if (!el.getClientRects().length) continue;           // not rendered (display:none etc.)
    const t = n.textContent;
    const tex = /\$\$|\\\(|\\\)|\\\[|\\\]|\\begin\{|\$[^\s$][^$]*[^\s$]\$|\$[^\s$\d]\$/;
    const cmd = /\\(frac|sqrt|operatorname|mathbb|mathrm|text|left|right|top|cdot|sum)\b/;
    if (tex.test(t) || cmd.test(t)) out.push(t.trim().slice(0, 120));
  }
  return out;
}
"""

PAGE_FACTS_JS = r"""
async () => {
  // Load every image now (lazy ones included) and wait for each to settle.
  const imgs = Array.from(document.images);
  imgs.forEach(img => { img.loading = "eager"; });
  await Promise.all(imgs.map(img => img.complete ? null : new Promise(r => {
    img.addEventListener("load", r, {once: true});
    img.addEventListener("error", r, {once: true});
    setTimeout(r, 15000);
  })));
  const ids = Array.from(document.querySelectorAll("[id]"), e => e.id)
      .concat(Array.from(document.querySelectorAll("a[name]"), e => e.getAttribute("name")));
  const links = Array.from(document.querySelectorAll("a[href]"), a => a.href);
  const brokenImages = imgs.filter(img => !(img.complete && img.naturalWidth > 0))
      .map(img => img.currentSrc || img.src || img.outerHTML.slice(0, 120));
  const math = Array.from(document.querySelectorAll("div.math, span.math"));
  const unrendered = math.filter(m => !m.querySelector("mjx-container"))
      .map(m => m.textContent.trim().slice(0, 120));
  const merrors = Array.from(document.querySelectorAll("mjx-merror, merror"),
      e => (e.getAttribute("data-mjx-error") || e.textContent).trim().slice(0, 120));
  const mathjaxScripts = Array.from(document.scripts, s => s.src)
      .filter(src => /mathjax/i.test(src));
  return {ids, links, brokenImages, imageCount: imgs.length, mathjaxScripts,
          mathCount: math.length,
          mjxCount: document.querySelectorAll("mjx-container").length, unrendered, merrors};
}
"""

# Every image in the article: where it comes from, its natural and rendered widths, and
# whether it is a notebook's output (a figure the code drew) or a diagram/strip.
FIGURES_JS = r"""
() => Array.from(document.querySelectorAll("article img")).map(img => ({
  src: img.getAttribute("src") || "",
  natural: img.naturalWidth,
  rendered: img.getBoundingClientRect().width,
  output: !!img.closest(".cell_output, .output"),
}))
"""


# Everything readers scroll past must fit the article column at 1280 px: code cells,
# outputs (text and images), tables and display equations. Run after the page facts: it
# opens every fold first (solutions, hidden inputs), so that folded content is measured
# too. An element overflows when it is wider than its own scroll box (it would scroll
# sideways) or reaches past the article column.
OVERFLOW_JS = r"""
() => {
  document.querySelectorAll("details").forEach(d => { d.open = true; });
  document.querySelectorAll(".toggle-hidden").forEach(e => e.classList.remove("toggle-hidden"));
  const article = document.querySelector("article.bd-article") || document.querySelector("main");
  if (!article) return [];
  const style = getComputedStyle(article);
  const col = article.getBoundingClientRect();
  const left = col.left + parseFloat(style.paddingLeft) - 1;
  const right = col.right - parseFloat(style.paddingRight) + 1;
  const out = [];
  const check = (kind, el, box, text) => {
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0) return;          // not laid out
    const scrolls = box && box.scrollWidth > box.clientWidth + 1;
    const beyond = r.right > right || r.left < left;
    if (scrolls || beyond) {
      out.push({kind, text: (text || el.innerText || "").trim().replace(/\s+/g, " ").slice(0, 50),
                width: Math.round(Math.max(r.width, box ? box.scrollWidth : 0)),
                column: Math.round(right - left)});
    }
  };
  article.querySelectorAll("div.highlight pre").forEach(e =>
      check(e.closest("div.cell_output") ? "output" : "code", e, e));
  article.querySelectorAll("div.cell_output pre").forEach(e => {
      if (!e.closest("div.highlight")) check("output", e, e); });
  article.querySelectorAll("img").forEach(e =>
      check("image", e, null, e.getAttribute("alt") || e.getAttribute("src")));
  article.querySelectorAll("table").forEach(e => check("table", e, e.parentElement));
  article.querySelectorAll('mjx-container[display="true"]').forEach(e =>
      check("equation", e, e.closest("div.math") || e,
            e.querySelector("mjx-assistive-mml") ? e.querySelector("mjx-assistive-mml").textContent
                                                 : ""));
  return out;
}
"""
# Pages whose code is not the book's: viewcode's copies of the library's source, whose
# lines are up to 100 characters (ruff's limit for mha_lib), shown as they are.
OVERFLOW_EXEMPT = ("_modules/",)


@dataclass
class PageReport:
    path: str  # relative to the html root, e.g. "book/intro.html"
    redirect: bool = False  # a meta-refresh stub: only its target link is checked
    js_errors: list[str] = field(default_factory=list)
    broken_images: list[str] = field(default_factory=list)
    image_count: int = 0
    mathjax_scripts: list[str] = field(default_factory=list)
    math_count: int = 0
    mjx_count: int = 0
    unrendered_math: list[str] = field(default_factory=list)
    math_errors: list[str] = field(default_factory=list)
    raw_tex: list[str] = field(default_factory=list)
    mathjax_problem: str = ""
    ids: set[str] = field(default_factory=set)
    links: list[str] = field(default_factory=list)
    overflow: list[dict] = field(default_factory=list)
    figures: list[dict] = field(default_factory=list)
    from_disk: bool = False  # read from disk (ids, links), not loaded in the browser


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture(scope="module")
def server(built_book: Path) -> Iterator[str]:
    """Serve the built HTML on 127.0.0.1:<free port>; yield the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(built_book))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, name="book-http", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def blocked_requests() -> list[str]:
    return []


@pytest.fixture(scope="session", autouse=True)
def _chromium_available() -> None:
    """Autouse + session scope: checked before the (session-scoped) book build."""
    chromium.require()


@pytest.fixture(scope="module")
def browser_context(blocked_requests: list[str]) -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = chromium.launch(pw)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        context.set_default_timeout(30_000)

        def only_loopback(route, request) -> None:  # noqa: ANN001
            if urlsplit(request.url).hostname in LOCAL_HOSTS:
                route.continue_()
            else:
                blocked_requests.append(request.url)
                route.abort("blockedbyclient")

        context.route("**/*", only_loopback)
        try:
            yield context
        finally:
            context.close()
            browser.close()


def _html_path(url: str, base: str) -> str | None:
    """'book/intro.html' for a same-site URL, else None."""
    if not url.startswith(base):
        return None
    path = unquote(urlsplit(url).path)[len(urlsplit(base).path):]
    return path + "index.html" if path == "" or path.endswith("/") else path


def _visit(page, base: str, rel: str) -> PageReport:  # noqa: ANN001
    """Load `rel` in `page` (one tab serves the whole crawl: a new tab per page doubled the
    crawl's time) and collect what the checks below need."""
    report = PageReport(rel)

    def on_error(exc) -> None:  # noqa: ANN001
        report.js_errors.append(f"uncaught: {exc}")

    def on_console(msg) -> None:  # noqa: ANN001
        if msg.type == "error":
            where = msg.location.get("url", "") if msg.location else ""
            report.js_errors.append(f"console.error: {msg.text} [{where}]")

    page.on("pageerror", on_error)
    page.on("console", on_console)
    try:
        page.goto(base + rel, wait_until="load")
        if page.locator("div.math, span.math").count():
            try:
                page.wait_for_function(
                    "() => window.MathJax && MathJax.startup && MathJax.startup.promise",
                    timeout=MATHJAX_TIMEOUT_MS)
                page.evaluate("() => MathJax.startup.promise.then(() => true)")
            except Exception as exc:  # noqa: BLE001 - reported as a check failure
                report.mathjax_problem = f"MathJax did not load/typeset: {exc}"
        facts = page.evaluate(PAGE_FACTS_JS)
        report.raw_tex = page.evaluate(VISIBLE_PROSE_TEXT_JS)
        report.overflow = page.evaluate(OVERFLOW_JS)
        report.figures = page.evaluate(FIGURES_JS)
    finally:
        page.remove_listener("pageerror", on_error)
        page.remove_listener("console", on_console)
    report.ids = set(facts["ids"])
    report.links = facts["links"]
    report.broken_images = facts["brokenImages"]
    report.image_count = facts["imageCount"]
    report.mathjax_scripts = facts["mathjaxScripts"]
    report.math_count = facts["mathCount"]
    report.mjx_count = facts["mjxCount"]
    report.unrendered_math = facts["unrendered"]
    report.math_errors = facts["merrors"]
    return report


# viewcode's pages of the library's source (_modules/...) are all one template with no
# math and no images: the first two met are loaded in Chromium like every other page (their
# scripts, their requests), the rest are read from disk for their ids and links, which the
# link check needs. Loading all ~40 in the browser took about a quarter of the crawl.
BROWSER_SAMPLE_OF = {"_modules/": 2}


def _static_report(html: str, base: str, rel: str) -> PageReport | None:
    """Ids and absolute links of a page read from disk; None if it needs the browser (it
    has images or math)."""
    from bs4 import BeautifulSoup  # ships with the book's theme (pydata-sphinx-theme)

    soup = BeautifulSoup(html, "html.parser")
    if soup.find("img") or soup.select_one("div.math, span.math"):
        return None
    ids = {e["id"] for e in soup.find_all(id=True)}
    ids |= {e["name"] for e in soup.find_all("a", attrs={"name": True})}
    links = [urljoin(base + rel, a["href"]) for a in soup.find_all("a", href=True)]
    return PageReport(rel, ids=ids, links=links, from_disk=True)


@pytest.fixture(scope="module")
def site(server: str, browser_context, built_book: Path, toc_pages: list[str]) -> dict:  # noqa: ANN001
    """Visit every HTML page of the build once: the _toc.yml pages, every other .html file
    (genindex, search, _modules/...) and anything reachable from them by same-site links.
    Pages of BROWSER_SAMPLE_OF's folders beyond its sample are read from disk instead."""
    every_html = sorted(
        p.relative_to(built_book).as_posix() for p in built_book.rglob("*.html")
        if not p.relative_to(built_book).parts[0].startswith(("_static", "_sources"))
    )
    queue = ["index.html"] + [f"{name}.html" for name in toc_pages] + every_html
    reports: dict[str, PageReport] = {}
    page = browser_context.new_page()
    while queue:
        rel = queue.pop(0)
        if rel in reports or not (built_book / rel).is_file():
            continue
        html = (built_book / rel).read_text(encoding="utf-8")
        refresh = META_REFRESH.search(html)
        folder = next((f for f in BROWSER_SAMPLE_OF if rel.startswith(f)), None)
        seen = sum(1 for r in reports.values() if folder and r.path.startswith(folder)
                   and not r.from_disk)
        report = None
        if refresh:
            target = urljoin(server + rel, refresh.group(1))
            report = PageReport(rel, redirect=True, links=[target])
        elif folder and seen >= BROWSER_SAMPLE_OF[folder]:
            report = _static_report(html, server, rel)
        reports[rel] = report = report or _visit(page, server, rel)
        for link in report.links:
            target = _html_path(urldefrag(link).url, server)
            if target and target.endswith(".html") and target not in reports:
                queue.append(target)
    page.close()
    return reports


def _fail_if(problems: list[str], title: str) -> None:
    if problems:
        pytest.fail(f"{title} ({len(problems)}):\n  " + "\n  ".join(problems), pytrace=False)


# --- checks ---------------------------------------------------------------------------

def test_every_toc_page_was_checked(site: dict, toc_pages: list[str]) -> None:
    missing = [f"{n}.html" for n in toc_pages if f"{n}.html" not in site]
    _fail_if(missing, "pages in _toc.yml that the browser could not reach")


def test_source_pages_are_sampled_in_the_browser_and_the_rest_read(site: dict) -> None:
    """viewcode's pages: the sample ran in Chromium, every other one was read for its ids
    and links (an empty read would let broken links into them pass unseen)."""
    for folder, sample in BROWSER_SAMPLE_OF.items():
        pages = [r for r in site.values() if r.path.startswith(folder)]
        loaded = [r.path for r in pages if not r.from_disk]
        assert len(loaded) == sample, (folder, loaded)
        assert len(pages) > sample, f"no {folder} pages read from disk: {len(pages)}"
        empty = [r.path for r in pages if r.from_disk and not (r.ids and r.links)]
        assert not empty, f"pages read with no ids or links: {empty}"


def test_a_page_with_images_or_math_is_not_read_from_disk() -> None:
    base = "http://127.0.0.1:1/"
    plain = '<div id="f"><a href="../x.html#y">x</a></div>'
    report = _static_report(plain, base, "_modules/m.html")
    assert report.ids == {"f"} and report.links == [base + "x.html#y"]
    for extra in ('<img src="a.png">', '<span class="math">x</span>'):
        assert _static_report(plain + extra, base, "_modules/m.html") is None, extra


def test_no_javascript_errors(site: dict) -> None:
    _fail_if([f"{r.path}: {e}" for r in site.values() for e in r.js_errors],
             "JavaScript errors (uncaught exceptions or console.error)")


def test_no_requests_leave_the_machine(site: dict, blocked_requests: list[str]) -> None:
    _fail_if(sorted(set(blocked_requests)),
             "pages asked for non-local URLs (blocked; the book must work offline)")


def test_external_requests_are_really_blocked(server: str, browser_context,  # noqa: ANN001
                                              blocked_requests: list[str], site: dict,
                                              toc_pages: list[str]) -> None:
    """The offline checks mean something only if a request off the machine really fails."""
    probe = "https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-chtml.js"
    before = len(blocked_requests)
    page = browser_context.new_page()
    try:
        page.goto(server + f"{toc_pages[0]}.html", wait_until="load")
        outcome = page.evaluate(
            "url => fetch(url).then(() => 'loaded', e => 'failed: ' + e)", probe)
    finally:
        page.close()
    caught = blocked_requests[before:]
    del blocked_requests[before:]  # the probe is not a request of the book's
    assert outcome.startswith("failed"), f"{probe} was reachable: {outcome}"
    assert probe in caught, f"the request blocker did not see {probe}: {caught}"


def test_math_renders_offline(site: dict, blocked_requests: list[str]) -> None:
    """MathJax comes from the book itself (_static/mathjax, served on loopback) and typesets
    every math page while every request off the machine is blocked."""
    math_pages = [r for r in site.values() if r.math_count]
    assert len(math_pages) >= 5, f"expected math on most chapters, found {len(math_pages)} pages"
    problems = [f"requested off the machine: {u}" for u in sorted(set(blocked_requests))]
    for r in math_pages:
        if not r.mathjax_scripts:
            problems.append(f"{r.path}: math but no MathJax <script>")
        problems += [f"{r.path}: MathJax not from the book: {src}" for src in r.mathjax_scripts
                     if urlsplit(src).hostname not in LOCAL_HOSTS
                     or "/_static/mathjax/" not in urlsplit(src).path]
        if r.mjx_count < r.math_count:
            problems.append(f"{r.path}: {r.math_count} math elements, {r.mjx_count} typeset")
    _fail_if(problems, "math does not render offline")


MARKDOWN_MATH = re.compile(r"\$[^$\s][^$\n]*\$|\$\$")


def _source(docname: str) -> Path | None:
    for suffix in (".md", ".ipynb"):
        if (REPO / f"{docname}{suffix}").is_file():
            return REPO / f"{docname}{suffix}"
    return None


def _markdown_and_images(path: Path) -> tuple[str, int]:
    """A page source's markdown text, and how many image outputs the HTML must show."""
    if path.suffix == ".md":
        return path.read_text(encoding="utf-8"), 0
    nb = json.loads(path.read_text(encoding="utf-8"))
    markdown, images = [], 0
    for cell in nb["cells"]:
        tags = cell.get("metadata", {}).get("tags", [])
        if cell["cell_type"] == "markdown":
            markdown.append("".join(cell["source"]))
        elif cell["cell_type"] == "code" and not {"remove-cell", "remove-output"} & set(tags):
            images += sum(1 for out in cell.get("outputs", [])
                          if any(k.startswith("image/") for k in out.get("data", {})))
    return "\n".join(markdown), images


def _pages_with_sources(site: dict, toc_pages: list[str]):
    """(name, markdown text, stored figures, page report) for every built toc page."""
    for name in toc_pages:
        src = _source(name)
        report = site.get(f"{name}.html")
        if src is not None and report is not None:
            yield (name, *_markdown_and_images(src), report)


def test_every_math_source_page_shows_math(site: dict, toc_pages: list[str]) -> None:
    """A page whose markdown has $...$ has typeset math (catches math left as plain text)."""
    problems = [f"{name}: its source has math, the page typeset none"
                for name, text, _, report in _pages_with_sources(site, toc_pages)
                if MARKDOWN_MATH.search(text) and not report.mjx_count]
    _fail_if(problems, "math missing from pages")


def test_notebook_figures_are_on_the_page(site: dict, toc_pages: list[str]) -> None:
    """Every figure a notebook stores is an <img> on its page (and loads: see above)."""
    problems = [f"{name}: {images} figures stored, {report.image_count} <img> shown"
                for name, _, images, report in _pages_with_sources(site, toc_pages)
                if report.image_count < images]
    _fail_if(problems, "figures missing from pages")


def _svg_min_font(path: Path) -> tuple[float, float]:
    """(smallest font size, view-box width) of an SVG file, in its own units."""
    text = path.read_text(encoding="utf-8")
    sizes = [float(v) for v in re.findall(r'font-size[=:]\s*"?([\d.]+)', text)]
    box = re.search(r'viewBox="[\d.\s-]+?\s([\d.]+)\s[\d.]+"', text)
    width = float(box.group(1)) if box else float(re.search(r'width="([\d.]+)', text).group(1))
    return (min(sizes) if sizes else float("inf")), width


def figure_problems(site: dict, built_book: Path) -> list[str]:
    """Every figure's smallest label as displayed, in CSS px (at least 10): for an SVG,
    its smallest font size times its rendered width over its view box; for a notebook's
    PNG, the book style's smallest font (MIN_FONT_PT at 100 dpi) times rendered width over
    natural width."""
    from mha_lib.viz import MIN_FONT_PT
    png_font = MIN_FONT_PT * 100 / 72  # px in the image
    problems = []
    for r in site.values():
        for fig in r.figures:
            if not fig["natural"] or not fig["rendered"]:
                continue
            if fig["src"].split("?")[0].endswith(".svg"):
                rel = posixpath.normpath(posixpath.join(posixpath.dirname(r.path),
                                                        fig["src"].split("?")[0]))
                font, width = _svg_min_font(built_book / rel)
                shown = font * fig["rendered"] / width
            elif fig["output"]:
                shown = png_font * fig["rendered"] / fig["natural"]
            else:
                continue
            if shown < 10:
                problems.append(f"{r.path}: {fig['src'][-40:]} smallest label {shown:.1f} px "
                                f"({fig['natural']} px wide, shown at {fig['rendered']:.0f})")
    return problems


def test_every_figure_label_is_at_least_10px(site: dict, built_book: Path) -> None:
    _fail_if(figure_problems(site, built_book), "figures whose labels are shrunk below 10 px")


def test_the_figure_check_catches_a_shrunk_figure(tmp_path: Path) -> None:
    svg = tmp_path / "d.svg"
    svg.write_text('<svg viewBox="0 0 750 200"><text font-size="12">a</text></svg>')
    site = {"p.html": PageReport("p.html", figures=[
        {"src": "d.svg", "natural": 750, "rendered": 500, "output": False},   # 8 px
        {"src": "x.png", "natural": 1300, "rendered": 688, "output": True},   # 6.6 px
        {"src": "y.png", "natural": 680, "rendered": 680, "output": True}])}  # 12.5 px
    problems = figure_problems(site, tmp_path)
    assert len(problems) == 2 and "d.svg" in problems[0] and "x.png" in problems[1], problems


def test_every_image_loads(site: dict) -> None:
    _fail_if([f"{r.path}: {src}" for r in site.values() for src in r.broken_images],
             "images that did not load (naturalWidth == 0)")


def test_math_renders(site: dict) -> None:
    problems = []
    for r in site.values():
        if not r.math_count:
            continue
        if r.mathjax_problem:
            problems.append(f"{r.path}: {r.mathjax_problem}")
        if not r.mjx_count:
            problems.append(f"{r.path}: {r.math_count} math elements but no <mjx-container>")
        problems += [f"{r.path}: not typeset: {m!r}" for m in r.unrendered_math]
        problems += [f"{r.path}: MathJax error: {m!r}" for m in r.math_errors]
    problems += [f"{r.path}: raw TeX delimiter in visible text: {t!r}"
                 for r in site.values() for t in r.raw_tex]
    _fail_if(problems, "math problems")


def test_nothing_is_wider_than_the_column(site: dict) -> None:
    """At 1280 px no code cell, output, image, table or display equation scrolls sideways
    or reaches past the article column (folded solutions and inputs included)."""
    problems = [f"{r.path}: {o['kind']} {o['width']} px in a {o['column']} px column: "
                f"{o['text']!r}"
                for r in site.values() if not r.path.startswith(OVERFLOW_EXEMPT)
                for o in r.overflow]
    _fail_if(problems, "elements wider than the article column at 1280 px")


def test_overflow_check_catches_a_wide_code_block(server: str, browser_context,  # noqa: ANN001
                                                  site: dict, toc_pages: list[str]) -> None:
    """The overflow check is not vacuous: a too-wide code block planted in a chapter is
    reported."""
    page = browser_context.new_page()
    try:
        page.goto(server + f"{toc_pages[1]}.html", wait_until="load")
        page.evaluate("""() => {
          const block = document.createElement("div");
          block.className = "highlight";
          const pre = document.createElement("pre");
          pre.textContent = "x = " + "1 + ".repeat(60) + "1";
          block.appendChild(pre);
          document.querySelector("article.bd-article").appendChild(block);
        }""")
        found = page.evaluate(OVERFLOW_JS)
    finally:
        page.close()
    assert any(o["kind"] == "code" and o["text"].startswith("x = 1 + 1") for o in found), found


def test_internal_links_and_anchors_resolve(site: dict, server: str, built_book: Path) -> None:
    problems = []
    for r in site.values():
        for link in r.links:
            url, fragment = urldefrag(link)
            target = _html_path(url, server)
            if target is None:
                continue  # external link: not followed (offline)
            if not (built_book / target).is_file():
                problems.append(f"{r.path}: link to missing file {target} ({link})")
                continue
            fragment = unquote(fragment)
            if fragment and target.endswith(".html"):
                ids = site[target].ids if target in site else set()
                if fragment not in ids:
                    problems.append(f"{r.path}: link to {target}#{fragment}: no such id there")
    _fail_if(sorted(set(problems)), "broken internal links")


def test_search_finds_attention(server: str, browser_context, site: dict,  # noqa: ANN001
                                toc_pages: list[str]) -> None:
    page = browser_context.new_page()
    try:
        page.goto(server + "search.html?q=attention", wait_until="load")
        results = page.locator("#search-results ul.search li")
        try:
            results.first.wait_for(state="attached", timeout=SEARCH_TIMEOUT_MS)
            # Sphinx appends the hits one by one and fills in its summary line when done.
            page.wait_for_function(
                "() => /Search finished/.test("
                "document.querySelector('#search-results p.search-summary')?.innerText || '')",
                timeout=SEARCH_TIMEOUT_MS)
        except Exception:  # noqa: BLE001
            summary = page.locator("#search-results").inner_text() or "(no #search-results)"
            pytest.fail(f'search.html?q=attention found nothing; page says: {summary!r}',
                        pytrace=False)
        hrefs = page.locator("#search-results ul.search li a").evaluate_all(
            "links => links.map(a => a.href)")
    finally:
        page.close()
    found = {_html_path(urldefrag(h).url, server) for h in hrefs}
    # Nearly every chapter is about attention: several must be hits, and every hit a real page.
    chapters = {f"{name}.html" for name in toc_pages[1:]}
    assert len(found & chapters) >= 3, f"search hits {sorted(found)}"
    assert None not in found and found <= set(site), sorted(found - set(site))


def test_screenshot_first_chapter(server: str, browser_context, toc_pages: list[str],  # noqa: ANN001
                                  site: dict) -> None:
    if len(toc_pages) < 2:
        pytest.fail("_toc.yml lists no chapter after the root page", pytrace=False)
    chapter = f"{toc_pages[1]}.html"
    page = browser_context.new_page()
    try:
        page.goto(server + chapter, wait_until="load")
        if page.locator("div.math, span.math").count():
            page.wait_for_function(
                "() => window.MathJax && MathJax.startup && MathJax.startup.promise",
                timeout=MATHJAX_TIMEOUT_MS)
            page.evaluate("() => MathJax.startup.promise.then(() => true)")
        page.evaluate("() => document.fonts.ready.then(() => true)")
        page.wait_for_timeout(1000)  # let the theme's sidebar/scroll transitions settle
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOT), full_page=True)
    finally:
        page.close()
    assert SCREENSHOT.is_file() and SCREENSHOT.stat().st_size > 10_000, (
        f"screenshot of {chapter} missing or suspiciously small: {SCREENSHOT}")


# The section the "Contents" sidebar marks, against the one in view: the last heading
# whose top is above 30% of the window (the theme's own band; _static/toc_follow.js).
_SIDEBAR_STOP = """() => {
  const nav = document.querySelector('#pst-page-toc-nav');
  const links = Array.from(nav.querySelectorAll("a[href^='#']"));
  const line = window.innerHeight * 0.3;
  let want = null;
  for (const a of links) {
    const s = document.getElementById(decodeURIComponent(a.hash.slice(1)));
    const h = s && (s.querySelector('h1, h2, h3, h4, h5, h6') || s);
    if (h && h.getBoundingClientRect().top <= line) want = a.hash;
  }
  const got = links.filter(a => a.classList.contains('active'))
                   .map(a => a.hash);
  return {want: want, got: got.length ? got[got.length - 1] : null};
}"""


def _sidebar_misses(page, url: str, first_miss: bool = False,  # noqa: ANN001
                    most: int = 12) -> tuple[list[str], int]:
    """Scroll `url` in jumps of 2,550 px (a scroll-bar drag, Page Down held); at each of
    the first `most` stops, compare the marked section with the one in view (with
    `first_miss`, stop at the first wrong one)."""
    page.goto(url, wait_until="load")
    height = page.evaluate("document.documentElement.scrollHeight")
    misses, stops = [], 0
    for y in range(0, height - 900, 2550):
        page.evaluate(f"window.scrollTo(0, {y})")
        for _ in range(20):  # the script marks after the next frame; under
            page.wait_for_timeout(50)  # load a frame can take longer
            stop = page.evaluate(_SIDEBAR_STOP)
            if stop["want"] is None or stop["got"] == stop["want"]:
                break
        if stop["want"] is None:
            continue
        stops += 1
        if stop["got"] != stop["want"]:
            misses.append(f"at {y} px: marked {stop['got']}, in view {stop['want']}")
        if stops == most or (first_miss and misses):
            break
    return misses, stops


def test_the_contents_sidebar_marks_the_section_in_view(
        server: str, browser_context, site: dict) -> None:  # noqa: ANN001
    page = browser_context.new_page()
    try:
        misses, stops = _sidebar_misses(page, server + "book/appendix_b_api.html")
        # the same scroll without toc_follow.js: the theme alone misses sections
        page.route("**/toc_follow.js*", lambda route: route.abort())
        unfollowed, _ = _sidebar_misses(page, server + "book/appendix_b_api.html",
                                        first_miss=True)
    finally:
        page.close()
    assert stops == 12, f"only {stops} stops on the API page"
    _fail_if(misses, "the sidebar marks another section than the one in view")
    assert unfollowed, "without toc_follow.js no stop was wrong: the check cannot fail"
