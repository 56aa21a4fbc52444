"""The attention explorer (mha_lib.viz.attention_explorer, chapter 15).

Without a browser: its HTML is self-contained (no URL, no require.js, no CDN),
deterministic (nbval compares it), carries the weights it was given, and refuses bad
input. With Chromium (marker ``browser``), offline (every request that is not a local
file is aborted and recorded): hovering each query and keyboard-focusing each key
highlights exactly the stored weights, in every layer and head; two explorers on one page
do not disturb each other; and in the built book chapter 15's explorer does the same
with the weights its page stores.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from mha_lib.viz import AttentionExplorer, attention_explorer
from tests import chromium

REPO = Path(__file__).resolve().parent.parent
TOKENS = ["the", "cat", "<sat>", "on", "a", "\"mat\"", "&"]


def causal_weights(layers: int, heads: int, length: int, seed: int) -> torch.Tensor:
    """Random rows that sum to 1 over the keys a causal query may see."""
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(layers, heads, length, length, generator=generator) * 2
    allowed = torch.ones(length, length, dtype=torch.bool).tril()
    return scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)


def stored(explorer: AttentionExplorer) -> dict:
    match = re.search(r'<script type="application/json" class="ae-data">(.*?)</script>',
                      explorer.html, re.S)
    assert match, "no data block in the explorer's HTML"
    return json.loads(match.group(1))


# --- without a browser --------------------------------------------------------------------

def test_html_is_self_contained_and_deterministic() -> None:
    weights = causal_weights(2, 3, len(TOKENS), seed=0)
    explorer = attention_explorer(weights, TOKENS, title="a <title>")
    html = explorer.html
    assert html.startswith('<div class="attention-explorer" id="ae-')
    for outside in ("http:", "https:", "//cdn", "require(", "requirejs", " src=", "<link",
                    "import("):
        assert outside not in html, f"the explorer reaches outside: {outside!r}"
    assert explorer._repr_html_() == html
    assert repr(explorer) == "AttentionExplorer(2 layers x 3 heads, 7 tokens)"
    # The same weights give the same HTML (nbval), other weights another id.
    assert attention_explorer(weights, TOKENS, title="a <title>").html == html
    other = attention_explorer(causal_weights(2, 3, len(TOKENS), seed=1), TOKENS)
    assert other.html.split('"', 4)[3] != html.split('"', 4)[3]
    # Tokens and title are escaped, not markup.
    assert "&lt;sat&gt;" in html and "<sat>" not in html.split("<script")[0]
    assert "a &lt;title&gt;" in html


def test_stored_weights_are_the_given_weights() -> None:
    weights = causal_weights(2, 3, len(TOKENS), seed=2)
    data = stored(attention_explorer(weights, TOKENS, digits=4))
    assert data["tokens"] == TOKENS
    assert data["layers"] == ["layer 1", "layer 2"]
    back = torch.tensor(data["weights"], dtype=torch.float64) / data["scale"]
    assert back.shape == weights.shape
    torch.testing.assert_close(back, weights.double(), atol=0.5e-4, rtol=0)


def test_lower_dimensional_weights_are_one_layer_and_one_head() -> None:
    weights = causal_weights(1, 1, 4, seed=3)
    for given in (weights[0, 0], weights[0]):
        data = stored(attention_explorer(given, list("abcd"), layer_names=["only"]))
        assert data["layers"] == ["only"]
        assert torch.tensor(data["weights"]).shape == (1, 1, 4, 4)


def test_first_view_is_drawn_without_scripts() -> None:
    """An untrusted notebook runs no script: the HTML itself shows layer 1, head 0, the
    last token as the query."""
    weights = causal_weights(2, 2, 5, seed=4)
    html = attention_explorer(weights, list("abcde")).html
    keys = html.split('class="ae-row ae-k"')[1].split("</div>")[0]
    shown = dict(re.findall(r'data-weight="([0-9.]+)"[^>]*data-pos="(\d)"', keys))
    shown = {int(pos): float(w) for w, pos in shown.items()}
    expected = {j: round(w, 3) for j, w in enumerate(weights[0, 0, -1].tolist())}
    assert shown == {j: w for j, w in expected.items() if w > 0}


@pytest.mark.parametrize("args, kwargs, error, words", [
    (([[0.5, 0.5]], ["a"]), {}, TypeError, "weights: expected a torch.Tensor"),
    ((torch.ones(3), ["a", "b", "c"]), {}, ValueError, "(N, H, L, L)"),
    ((torch.ones(1, 1, 1, 2, 3, 3), list("abc")), {}, ValueError, "(N, H, L, L)"),
    ((torch.ones(2, 3), ["a", "b"]), {}, ValueError, "(N, H, L, L)"),
    ((torch.ones(0, 0), []), {}, ValueError, "L > 0"),
    ((torch.full((2, 2), float("nan")), ["a", "b"]), {}, ValueError, "finite"),
    ((-torch.ones(2, 2), ["a", "b"]), {}, ValueError, "non-negative"),
    ((torch.ones(2, 2) / 2, ["a"]), {}, ValueError, "tokens: expected a sequence of 2"),
    ((torch.ones(2, 2) / 2, "ab"), {}, ValueError, "tokens: expected a sequence of 2"),
    ((torch.ones(2, 1, 2, 2) / 2, ["a", "b"]), {"layer_names": ["x"]}, ValueError,
     "layer_names: expected 2 names"),
    ((torch.ones(2, 2) / 2, ["a", "b"]), {"digits": 0}, ValueError, "digits"),
    ((torch.ones(2, 2) / 2, ["a", "b"]), {"digits": True}, ValueError, "digits"),
])
def test_bad_input_is_refused(args, kwargs, error, words) -> None:  # noqa: ANN001
    with pytest.raises(error, match=re.escape(words)):
        attention_explorer(*args, **kwargs)


def test_save_writes_a_page(tmp_path: Path) -> None:
    explorer = attention_explorer(causal_weights(1, 2, 3, seed=5), list("xyz"))
    page = tmp_path / "explorer.html"
    explorer.save(page)
    text = page.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and explorer.html in text


# --- in Chromium, offline ----------------------------------------------------------------

@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    chromium.require()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = chromium.launch(pw)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture()
def offline_page(browser):  # noqa: ANN001, ANN201
    """A 1280 px page that may load local files only; yields (page, requests it tried
    elsewhere, its JavaScript errors)."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    blocked: list[str] = []
    errors: list[str] = []

    def local_only(route, request) -> None:  # noqa: ANN001
        if request.url.startswith("file:"):
            route.continue_()
        else:
            blocked.append(request.url)
            route.abort("blockedbyclient")

    context.route("**/*", local_only)
    page = context.new_page()
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        yield page, blocked, errors
    finally:
        context.close()


def shown_weights(root, side: str) -> list[float]:  # noqa: ANN001
    """The data-weight of every token of one row (0 where nothing is highlighted)."""
    return root.locator(f".ae-{side} .ae-tok").evaluate_all(
        "els => els.map(e => +(e.getAttribute('data-weight') || 0))")


# One round trip per view: is the token active (and, for keys, focused), and the weights
# the other row shows. (Playwright's hover() waits for each element to be stable and
# visible, three calls a view: the explorer tests took 24 s; the mouse is moved to the
# token's centre instead, a real hover all the same.)
VIEW_JS = """([root, side, pos]) => {
  const me = root.querySelector(`.ae-${side} .ae-tok[data-pos='${pos}']`);
  const other = side === "q" ? "k" : "q";
  return {active: me.classList.contains("ae-active"), focused: me === document.activeElement,
          weights: Array.from(root.querySelectorAll(`.ae-${other} .ae-tok`),
                              e => +(e.getAttribute("data-weight") || 0))};
}"""
CENTRES_JS = """root => Array.from(root.querySelectorAll(".ae-q .ae-tok"), e => {
  const r = e.getBoundingClientRect();
  return [r.left + r.width / 2, r.top + r.height / 2];
})"""


def check_explorer(root, weights: torch.Tensor, page) -> int:  # noqa: ANN001
    """Hover every query (the mouse on it) and focus every key (by keyboard: Tab from the
    previous token), in every layer and head; compare what lights up with ``weights``
    (N, H, L, L). Returns how many views were checked."""
    layers, heads, length = weights.size(0), weights.size(1), weights.size(-1)
    handle = root.element_handle()
    checked = 0
    for layer in range(layers):
        root.locator(".ae-layer").select_option(str(layer))
        for head in range(heads):
            root.locator(".ae-head").select_option(str(head))
            root.scroll_into_view_if_needed()
            centres = handle.evaluate(CENTRES_JS)
            height = page.viewport_size["height"]
            assert all(0 < y < height for _, y in centres), "explorer taller than the view"
            for i, (x, y) in enumerate(centres):  # point at query i: the keys show row i
                page.mouse.move(x, y)
                view = page.evaluate(VIEW_JS, [handle, "q", i])
                assert view["active"], f"query {i} not active under the mouse"
                torch.testing.assert_close(
                    torch.tensor(view["weights"], dtype=torch.float64),
                    weights[layer, head, i].double(),
                    atol=0.6e-3, rtol=0, msg=f"layer {layer}, head {head}, query {i}")
            page.mouse.move(0, 0)
            root.locator(".ae-k .ae-tok[data-pos='0']").focus()
            for j in range(length):  # focus key j: the queries show column j
                if j:
                    page.keyboard.press("Tab")
                view = page.evaluate(VIEW_JS, [handle, "k", j])
                assert view["focused"] and view["active"], f"key {j}: {view}"
                torch.testing.assert_close(
                    torch.tensor(view["weights"], dtype=torch.float64),
                    weights[layer, head, :, j].double(),
                    atol=0.6e-3, rtol=0, msg=f"layer {layer}, head {head}, key {j}")
                checked += 2
            name = root.locator(".ae-layer option:checked").text_content()
            assert root.locator(".ae-status").text_content().startswith(
                f"{name}, head {head}: key")
    return checked


@pytest.mark.browser
def test_hover_and_focus_show_the_stored_weights(offline_page, tmp_path: Path) -> None:  # noqa: ANN001
    page, blocked, errors = offline_page
    first = causal_weights(2, 3, len(TOKENS), seed=6)
    second = causal_weights(1, 2, 4, seed=7)
    body = (attention_explorer(first, TOKENS).html
            + attention_explorer(second, list("wxyz")).html)
    path = tmp_path / "two.html"
    path.write_text(f"<!DOCTYPE html><html><body>{body}</body></html>", encoding="utf-8")
    page.goto(path.as_uri())
    roots = page.locator(".attention-explorer")
    assert roots.count() == 2
    # Each script ran once, on its own explorer.
    assert roots.evaluate_all("els => els.map(e => e.getAttribute('data-ready'))") \
        == ["1", "1"]
    before = shown_weights(roots.nth(1), "k")
    assert check_explorer(roots.nth(0), first, page) == 2 * 3 * 2 * len(TOKENS)
    assert shown_weights(roots.nth(1), "k") == before, "one explorer changed the other"
    assert check_explorer(roots.nth(1), second, page) == 1 * 2 * 2 * 4
    assert errors == [] and blocked == []


@pytest.mark.browser
def test_chapter_15_explorer_in_the_built_book(offline_page, built_book: Path) -> None:  # noqa: ANN001
    """The published page, opened from disk with the network blocked: its explorer
    highlights the weights the page stores."""
    page, blocked, errors = offline_page
    page.goto((built_book / "book" / "15_attention_at_work.html").as_uri())
    root = page.locator(".attention-explorer")
    assert root.count() == 1
    data = json.loads(root.locator(".ae-data").text_content())
    weights = torch.tensor(data["weights"], dtype=torch.float64) / data["scale"]
    assert weights.shape[0] == 2 and weights.shape[-1] == len(data["tokens"])
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1],
                                                           dtype=torch.float64),
                               atol=weights.shape[-1] * 0.5e-3, rtol=0)
    assert check_explorer(root, weights, page) > 0
    width = root.evaluate("e => e.getBoundingClientRect().width")
    column = root.evaluate("e => e.parentElement.getBoundingClientRect().width")
    assert width <= column + 1, "the explorer is wider than the book's column"
    assert errors == []
    assert blocked == []


# --- tokens that are markup, and the size of the page ------------------------------------

HOSTILE = ["<!--", "<script>", "&amp;", "</script>", "a\u2028b", "x\u2029", "<b>"]


def test_data_block_escapes_what_the_html_parser_reads() -> None:
    """No '<', '>' or '&' (nor U+2028/U+2029) inside the JSON: a token "<!--" followed by
    "<script>" would otherwise put the parser in its double-escaped state and swallow the
    explorer's script and the rest of the page. The data reads back unchanged."""
    weights = causal_weights(1, 2, len(HOSTILE), seed=8)
    html = attention_explorer(weights, HOSTILE, layer_names=["<b>&"]).html
    block = html.split('class="ae-data">', 1)[1].split("</script>", 1)[0]
    for char in ("<", ">", "&", "\u2028", "\u2029"):
        assert char not in block, f"{char!r} in the data block"
    data = json.loads(block)
    assert data["tokens"] == HOSTILE and data["layers"] == ["<b>&"]
    assert html.count("<script") == 2 and html.count("</script>") == 2


def test_too_many_weights_are_refused_unless_allowed() -> None:
    weights = torch.full((2, 2, 30, 30), 1 / 30)  # 3,600 weights
    tokens = [str(i) for i in range(30)]
    with pytest.raises(ValueError, match=r"weights: expected at most max_weights=1,000 "
                                         r"weights .* got 2 x 2 x 30 x 30 = 3,600: pass fewer"):
        attention_explorer(weights, tokens, max_weights=1000)
    assert stored(attention_explorer(weights, tokens, max_weights=3600))["weights"]
    big = torch.full((1, 4, 501, 501), 1 / 501)  # past the default, 1,000,000
    with pytest.raises(ValueError, match=r"max_weights=1,000,000"):
        attention_explorer(big, ["t"] * 501)
    with pytest.raises(ValueError, match=r"max_weights: expected a positive int"):
        attention_explorer(weights, tokens, max_weights=0)


@pytest.mark.browser
def test_markup_tokens_leave_the_explorer_and_the_page_whole(offline_page,  # noqa: ANN001
                                                             tmp_path: Path) -> None:
    """In Chromium: with tokens that are markup, the explorer's script runs (hover and focus
    show the stored weights) and what follows it on the page is still there."""
    page, blocked, errors = offline_page
    weights = causal_weights(1, 2, len(HOSTILE), seed=9)
    body = (attention_explorer(weights, HOSTILE).html
            + '<p id="after">the rest of the page</p>')
    path = tmp_path / "hostile.html"
    path.write_text(f"<!DOCTYPE html><html><body>{body}</body></html>", encoding="utf-8")
    page.goto(path.as_uri())
    root = page.locator(".attention-explorer")
    assert root.count() == 1 and root.get_attribute("data-ready") == "1"
    assert page.locator("#after").text_content() == "the rest of the page"
    shown = root.locator(".ae-q .ae-tok").evaluate_all(
        "els => els.map(e => e.firstChild.textContent)")
    assert shown == HOSTILE
    assert check_explorer(root, weights, page) == 1 * 2 * 2 * len(HOSTILE)
    assert errors == [] and blocked == []
