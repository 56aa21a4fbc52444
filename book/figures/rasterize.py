"""PNG copies of the book's SVG diagrams, for the notebooks to carry inside them.

A notebook opened on its own (downloaded, or on Colab) has no ``figures/`` folder beside
it, so it carries its diagrams as cell attachments. JupyterLab does not display SVG
attachments (it shows PNG ones), so the attachments are PNG copies of the SVG files,
drawn by headless Chromium at twice the SVG's size. The HTML book keeps showing the SVG.

Each PNG records the SHA-256 of the SVG it was drawn from (a ``Source-SHA256`` text
chunk), so ``tests/test_notebook_forms.py`` finds a stale copy without drawing again
(drawing depends on the machine's fonts, the hash does not).

Usage (from the repository root, after ``make_figures.py``)::

    .venv/bin/python book/figures/rasterize.py          # every stale PNG
    .venv/bin/python book/figures/rasterize.py --check  # exit 1 if one is stale
"""

from __future__ import annotations

import argparse
import hashlib
import re
import struct
import sys
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
KEY = b"Source-SHA256"
SCALE = 2


def svg_hash(svg: Path) -> str:
    return hashlib.sha256(svg.read_bytes()).hexdigest()


def recorded_hash(png: Path) -> str | None:
    """The ``Source-SHA256`` text chunk of ``png``, or None."""
    data = png.read_bytes()
    at = 8
    while at < len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        if kind == b"tEXt":
            key, _, value = data[at + 8:at + 8 + length].partition(b"\0")
            if key == KEY:
                return value.decode("ascii")
        at += 12 + length
    return None


def with_text(png: bytes, key: bytes, value: str) -> bytes:
    """``png`` with a tEXt chunk ``key=value`` after its header chunk."""
    body = key + b"\0" + value.encode("ascii")
    chunk = (struct.pack(">I", len(body)) + b"tEXt" + body
             + struct.pack(">I", zlib.crc32(b"tEXt" + body) & 0xFFFFFFFF))
    end_of_ihdr = 8 + 12 + struct.unpack(">I", png[8:12])[0]
    return png[:end_of_ihdr] + chunk + png[end_of_ihdr:]


def stale(folder: Path = HERE) -> list[Path]:
    """The SVGs whose PNG copy is missing or was drawn from another version."""
    return [svg for svg in sorted(folder.glob("*.svg"))
            if not svg.with_suffix(".png").is_file()
            or recorded_hash(svg.with_suffix(".png")) != svg_hash(svg)]


def draw(svgs: list[Path]) -> None:
    sys.path.insert(0, str(HERE.parent.parent))
    from playwright.sync_api import sync_playwright

    from tests import chromium

    with sync_playwright() as pw:
        browser = chromium.launch(pw)
        page = browser.new_page(device_scale_factor=SCALE)
        for svg in svgs:
            text = svg.read_text(encoding="utf-8")
            box = re.search(r'viewBox="[\d.\s-]+?\s([\d.]+)\s([\d.]+)"', text)
            width, height = (float(box.group(1)), float(box.group(2)))
            page.set_viewport_size({"width": int(width + 0.999),
                                    "height": int(height + 0.999)})
            page.set_content('<html><body style="margin:0;background:#fff">'
                             f'<img src="data:image/svg+xml;charset=utf-8,{_quote(text)}" '
                             f'style="display:block;width:{width}px;height:{height}px">'
                             '</body></html>')
            page.wait_for_function("() => document.images[0].complete")
            png = page.locator("img").screenshot(type="png")
            svg.with_suffix(".png").write_bytes(with_text(png, KEY, svg_hash(svg)))
            print(f"drew {svg.with_suffix('.png').name}")
        browser.close()


def _quote(text: str) -> str:
    from urllib.parse import quote
    return quote(text, safe="")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a PNG is stale")
    args = parser.parse_args(argv)
    todo = stale()
    if args.check:
        if todo:
            print("stale PNG copies (run book/figures/rasterize.py): "
                  + ", ".join(p.name for p in todo), file=sys.stderr)
        return 1 if todo else 0
    draw(todo)
    return 0


if __name__ == "__main__":
    sys.exit(main())
