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
    sizes = [float(el.get("font-size")) for el in root.iter(f"{SVG}text")]
    assert min(sizes) >= 11, f"{path.name}: text smaller than 11 px"
    assert not re.search(r"https?://(?!www\.w3\.org)", path.read_text(encoding="utf-8"))
