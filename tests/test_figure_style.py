"""Every notebook figure is drawn to be read at the book's column width (fast, no kernel).

The browser test (``test_every_figure_label_is_at_least_10px``) measures each figure as
displayed, assuming the book's style: a figure at most ``COLUMN_INCHES`` wide is shown at
its own size, and no label is smaller than ``MIN_FONT_PT``. This checks that the code
cells keep to that style.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mha_lib.viz import COLUMN_INCHES, MIN_FONT_PT
from tests.front_matter import book_notebooks

FIGSIZE = re.compile(r"figsize=\(\s*([\d.]+)\s*(?:\*\s*([\d.]+))?")
FONT = re.compile(r"\b(?:fontsize|labelsize|size)\s*=\s*([\d.]+)\b")


def problems(source: str) -> list[str]:
    found = []
    for m in FIGSIZE.finditer(source):
        width = float(m.group(1)) * float(m.group(2) or 1)
        if width > COLUMN_INCHES + 1e-9:
            found.append(f"figsize width {width} > {COLUMN_INCHES} in (shrunk to fit)")
    for m in FONT.finditer(source):
        if float(m.group(1)) < MIN_FONT_PT:
            found.append(f"{m.group(0)} < {MIN_FONT_PT} pt")
    return found


def _code(path: Path) -> list[str]:
    return ["".join(c["source"]) for c in json.loads(path.read_text())["cells"]
            if c["cell_type"] == "code"]


@pytest.mark.parametrize("path", book_notebooks(), ids=lambda p: p.name)
def test_figures_fit_the_column_with_readable_labels(path: Path) -> None:
    cells = _code(path)
    if any("matplotlib" in c for c in cells):
        assert any("use_book_style()" in c for c in cells), (
            f"{path.name}: draws figures but never calls mha_lib.viz.use_book_style()")
    found = [f"cell {i}: {p}" for i, c in enumerate(cells) for p in problems(c)]
    assert not found, f"{path.name}: " + "; ".join(found)


def test_the_style_check_catches_wide_figures_and_small_fonts() -> None:
    assert problems("plt.subplots(1, 4, figsize=(13, 3.4))")
    assert problems("fig = plt.figure(figsize=(3.2 * 4, 3))")
    assert problems("ax.text(0, 0, 'a', fontsize=7)")
    assert problems("ax.tick_params(labelsize=7)")
    assert not problems("plt.subplots(figsize=(6.8, 3)); ax.text(0, 0, 'a', fontsize=9)")
