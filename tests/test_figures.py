"""The book's diagrams (book/figures/*.svg) are drawn by book/figures/make_figures.py from
the running example run through mha_lib: regenerated, they must equal the committed files.

Fix a failure with `.venv/bin/python book/figures/make_figures.py` (then look at the
figures and commit them)."""

from __future__ import annotations

import importlib.util
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIGURES = REPO / "book" / "figures"
SVG = "{http://www.w3.org/2000/svg}"


def load_make_figures():
    spec = importlib.util.spec_from_file_location("make_figures", FIGURES / "make_figures.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


make_figures = load_make_figures()
COMMITTED = sorted(FIGURES.glob("*.svg"))


def test_regenerated_figures_equal_the_committed_ones(tmp_path: Path) -> None:
    assert make_figures.main(["--out", str(tmp_path)]) == 0
    made = {p.name: p.read_text(encoding="utf-8") for p in tmp_path.glob("*.svg")}
    committed = {p.name: p.read_text(encoding="utf-8") for p in COMMITTED}
    assert sorted(made) == sorted(committed), "figures added or removed: regenerate"
    stale = [name for name in made if made[name] != committed[name]]
    assert not stale, (f"{stale} differ from what make_figures.py draws now; run "
                       "`.venv/bin/python book/figures/make_figures.py`")


def test_every_chapter_of_parts_one_to_three_has_a_strip() -> None:
    assert [p.name for p in COMMITTED if p.name.startswith("strip_")] == [
        f"strip_{n:02d}.svg" for n in range(1, 12)]


def test_shapes_come_from_the_running_example() -> None:
    s = make_figures.running_example()
    assert (s.ids, s.embedded, s.q, s.q_heads, s.weights, s.merged, s.output) == (
        (3, 6), (3, 6, 8), (3, 6, 8), (3, 4, 6, 2), (3, 4, 6, 6), (3, 6, 8), (3, 6, 8))
    pipeline = (FIGURES / "pipeline.svg").read_text(encoding="utf-8")
    for shape in ("(3, 6)", "(3, 6, 8)", "(3, 4, 6, 2)", "(3, 4, 6, 6)"):
        assert shape in pipeline


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.name)
def test_figure_is_accessible_and_fits_the_column(path: Path) -> None:
    root = ET.parse(path).getroot()
    title, desc = root.find(f"{SVG}title"), root.find(f"{SVG}desc")
    assert title is not None and len(title.text or "") > 10, f"{path.name}: no <title>"
    assert desc is not None and len(desc.text or "") > 40, f"{path.name}: no <desc>"
    # About the article column at a 1280 px window: scaled down by at most ~10%.
    assert int(root.get("width")) <= 760, f"{path.name}: wider than the article column"
    assert root.get("viewBox", "").startswith("0 0 ")
    # A white background under everything (readable in the book's dark mode).
    first = next(el for el in root if el.tag == f"{SVG}rect")
    assert first.get("fill") == "#ffffff" and first.get("width") == root.get("width")
    # Only generic font families (present on every machine, offline).
    families = {el.get("font-family") for el in root.iter() if el.get("font-family")}
    assert families <= {"sans-serif", "monospace"}, f"{path.name}: fonts {families}"
    # Every font size, sub- and superscripts (tspans) included: the column shows the
    # 750-unit view box 688 px wide (672 in a captioned figure), so 11.2 units are at
    # least 10 px, the book's smallest label.
    sizes = [float(el.get("font-size")) for el in root.iter() if el.get("font-size")]
    assert min(sizes) >= make_figures.MIN_FONT >= 11.2, (
        f"{path.name}: text of {min(sizes)} units, under 10 px in the column")
    assert not re.search(r"https?://(?!www\.w3\.org)", path.read_text(encoding="utf-8"))


# The diagram of each chapter of part four, and the notebook that shows it.
CHAPTER_DIAGRAMS = {
    "tiling.svg": "13_cost_and_speed.ipynb",
    "kv_cache.svg": "14_kv_cache_and_gqa.ipynb",
    "gqa.svg": "14_kv_cache_and_gqa.ipynb",
    "rope_pairs.svg": "16_rotary.ipynb",
    "window_cache.svg": "17_sliding_windows_alibi_flex.ipynb",
    "latent.svg": "18_latent_attention.ipynb",
}


@pytest.mark.parametrize("name", sorted(CHAPTER_DIAGRAMS))
def test_chapter_diagram_is_in_its_chapter(name: str) -> None:
    text = (REPO / "book" / CHAPTER_DIAGRAMS[name]).read_text(encoding="utf-8")
    png = name.replace(".svg", ".png")  # notebooks carry the diagram's PNG copy
    assert f"](attachment:{png})" in text, (
        f"{CHAPTER_DIAGRAMS[name]} does not show {name}: add `![alt](figures/{name})` "
        "to a Markdown cell and run `make front-matter`")


def test_every_figure_is_shown_somewhere() -> None:
    book = REPO / "book"
    pages = [p.read_text(encoding="utf-8") for p in (*book.glob("*.ipynb"),
                                                     *book.glob("*.md"))]
    # A notebook carries the PNG copy of a diagram as an attachment; Markdown pages the SVG.
    unused = [p.name for p in COMMITTED
              if not any(name in page for page in pages
                         for name in (p.name, p.with_suffix(".png").name))]
    assert not unused, f"figures no page shows: {unused}"


def test_tiling_follows_the_online_softmax() -> None:
    r = make_figures.online_softmax()
    assert (r.length, r.block, r.head_dim) == (6, 2, 2)
    # The row drawn shows both cases: one block leaves the maximum unchanged
    # (factor 1), another raises it sharply (a factor well below 1).
    assert 1.0 in r.correction[1:] and min(r.correction[1:]) < 0.5
    assert r.running_max == tuple(sorted(r.running_max))
    assert make_figures.tiles_at(6, 2) == (9, 6)
    assert make_figures.tiles_at(1000, 128) == (64, 36)  # chapter 13's numbers


def test_cache_step_and_grouping_come_from_mha_lib() -> None:
    c = make_figures.cache_step(3)
    assert (c.cached_before, c.cached_after, c.weights, c.output) == (
        (3, 4, 3, 2), (3, 4, 4, 2), (3, 4, 1, 4), (3, 1, 8))
    assert abs(sum(c.row) - 1) < 1e-6
    reads = {kv: make_figures.grouping(kv).reads for kv in (4, 2, 1)}
    assert reads == {4: (0, 1, 2, 3), 2: (0, 0, 1, 1), 1: (0, 0, 0, 0)}
    assert [make_figures.grouping(kv).per_token for kv in (4, 2, 1)] == [16, 8, 4]


def test_rotary_pairs_are_the_library_layouts() -> None:
    p = make_figures.rotary_picture(8)
    assert p.half == (4, 5, 6, 7, 0, 1, 2, 3)         # (i, i + D/2)
    assert p.adjacent == (1, 0, 3, 2, 5, 4, 7, 6)     # (2i, 2i + 1)
    assert [round(t, 6) for t in p.thetas] == [1.0, 0.1, 0.01, 0.001]


def test_window_cache_is_what_kv_cache_stores() -> None:
    """KVCache(window=3), one token per call, keeps 2 positions between calls in 3 slots
    (the window, 2, plus an eighth of it rounded up) and slides them to the front when
    full. If the library changes how it stores a window, this fails: re-read chapter 17's
    'What the windowed KVCache allocates'."""
    w = make_figures.window_picture(6, 3)
    assert w.capacity == 3
    assert w.slots[2] == (0, 1, 2)
    assert w.slots[5] == (3, 4, 5)
    assert w.read == ((0, 1), (0, 2), (0, 3), (0, 3), (0, 3), (0, 3))
    assert w.kept == (1, 2, 2, 2, 2, 2)


def test_latent_cache_sizes() -> None:
    p = make_figures.latent_picture()
    assert p.cached_keys == (3, 1, 6, 2) and p.cached_values == (3, 1, 6, 3)
    assert sorted(p.per_token.values()) == [4, 5, 8, 16]


def test_intro_heat_map_is_chapter_15s_stored_output() -> None:
    """The introduction shows chapter 15's induction-head map as a copied PNG: after chapter
    15 is re-executed the copy must follow (write the cell's image/png to the file again)."""
    import base64
    import json

    notebook = json.loads((REPO / "book" / "15_attention_at_work.ipynb").read_text("utf-8"))
    cell = next(c for c in notebook["cells"] if c.get("id") == "cell-31")
    images = [base64.b64decode(o["data"]["image/png"]) for o in cell["outputs"]
              if "image/png" in o.get("data", {})]
    assert len(images) == 1, f"chapter 15's cell-31 has {len(images)} images, expected 1"
    assert (FIGURES / "induction_heads.png").read_bytes() == images[0], (
        "book/figures/induction_heads.png differs from chapter 15's stored map (cell-31)")


def _notebook_function(notebook: str, name: str):
    """Define the function ``name`` from the code cell of ``notebook`` that defines it."""
    import torch

    import mha_lib
    from tests.sync import code_cells

    cells = code_cells(REPO / "book" / notebook)
    (source,) = [s for _, s in cells if f"def {name}(" in s]
    scope = {"torch": torch, "mha_lib": mha_lib}
    exec(compile(source, notebook, "exec"), scope)
    return scope[name]


def test_ring_figures_are_what_chapter_17s_rolling_buffer_returns() -> None:
    """Both ring figures of chapter 17 (decoding one token a call; chunks of 3) hold the
    positions and masks that the chapter's ``rolling_buffer_attention`` returns."""
    import torch

    import mha_lib

    rolling = _notebook_function("17_sliding_windows_alibi_flex.ipynb",
                                 "rolling_buffer_attention")
    torch.manual_seed(0)
    mha, x = mha_lib.MultiHeadAttention(8, 4), torch.randn(3, 6, 8)
    with torch.no_grad():
        _, decoded = rolling(mha, x, 3, 1)
        _, chunked = rolling(mha, x, 3, 3)
    assert len(decoded) == 6 and len(chunked) == 2
    for t, (_, kv_pos, step_mask) in enumerate(decoded):  # first figure
        ring = make_figures.ring_before(t, 3)  # None: an empty slot
        assert kv_pos.tolist() == [-3 if p is None else p for p in ring] + [t]
        assert step_mask[0].tolist() == [p is not None and t - p < 3 for p in ring] + [True]
    steps = make_figures.chunk_picture(6, 3, 3).steps  # second figure
    for (_, kv_pos, chunk_mask), (held, pos, rows, _) in zip(chunked, steps, strict=True):
        assert kv_pos.tolist() == [*held, *pos]
        assert chunk_mask.tolist() == [list(r) for r in rows]
