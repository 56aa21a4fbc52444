"""Draw the book's diagrams as SVG, with the shapes of the running example.

Every shape written into a figure is computed here, by running the book's running
example (``mha_lib.exercises.SENTENCES``: 3 sentences of 6 tokens, ``d_model`` 8,
4 heads) through ``mha_lib``, so the figures stay true when the code changes.
``tests/test_figures.py`` regenerates them into a temporary folder and fails if they
differ from the committed files.

Usage (from the repository root)::

    .venv/bin/python book/figures/make_figures.py          # rewrite book/figures/*.svg
    .venv/bin/python book/figures/make_figures.py --check  # exit 1 if a file is stale

Plain Python writing SVG text: no drawing library, no network. Each SVG has a
``<title>`` and a ``<desc>``, a white background (it reads the same in the book's dark
mode), generic font families (sans-serif, monospace), and a 750-unit-wide view box, the
width of the book's article column at a 1280 px window.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

import torch
from torch import nn

HERE = Path(__file__).resolve().parent

WIDTH = 750
SANS = "sans-serif"
MONO = "monospace"
INK = "#1f2937"        # text and lines
MUTED = "#4b5563"      # shape labels
BOX = "#f3f4f6"        # a stage
BOX_EDGE = "#9ca3af"
HOT = "#fde68a"        # a stage this chapter covers
HOT_EDGE = "#b45309"
ACCENT = "#dbeafe"     # the attention core
ACCENT_EDGE = "#1d4ed8"
GREEN = "#dcfce7"
GREEN_EDGE = "#15803d"
FADED = "#9ca3af"      # text of what is no longer read
# The smallest font size, sub- and superscripts included, in view-box units: the view box
# is shown 688 px wide in the column at a 1280 px window (672 px in a captioned figure),
# so 11.2 units are 10.3 px (10.0 px).
MIN_FONT = 11.2


# --- the running example, through mha_lib -------------------------------------------------

@dataclass(frozen=True)
class Shapes:
    """The shapes of every stage of the running example, as computed by mha_lib."""

    batch: int
    length: int
    d_model: int
    heads: int
    head_dim: int
    vocab: int
    d_ff: int
    ids: tuple[int, ...]
    embedded: tuple[int, ...]
    positioned: tuple[int, ...]
    q: tuple[int, ...]
    q_heads: tuple[int, ...]
    weights: tuple[int, ...]
    head_out: tuple[int, ...]
    merged: tuple[int, ...]
    output: tuple[int, ...]
    ffn_hidden: tuple[int, ...]


def example(d_model: int = 8, num_heads: int = 4):
    """The running example's token ids, embeddings, input ``x`` (with positions) and a
    ``MultiHeadAttention`` module, made with the seeds the figures always use."""
    import mha_lib
    from mha_lib.exercises import SENTENCES

    torch.manual_seed(0)
    stoi = mha_lib.build_vocab(SENTENCES)
    ids, _ = mha_lib.encode(SENTENCES, stoi)                          # (B, L)
    embedded = nn.Embedding(len(stoi), d_model)(ids)                  # (B, L, d_model)
    x = mha_lib.PositionalEncoding(d_model, dropout=0.0)(embedded)    # (B, L, d_model)
    mha = mha_lib.MultiHeadAttention(d_model, num_heads).eval()
    return stoi, ids, embedded, x, mha


def running_example(d_model: int = 8, num_heads: int = 4) -> Shapes:
    """Run the book's running example through mha_lib, stage by stage, and record the
    shapes; the full module must agree with the stages."""
    import mha_lib

    stoi, ids, embedded, x, mha = example(d_model, num_heads)
    q, k, v = mha.q_proj(x), mha.k_proj(x), mha.v_proj(x)             # (B, L, d_model)
    qh, kh, vh = (mha_lib.split_heads(t, num_heads) for t in (q, k, v))  # (B, H, L, D)
    head_out, weights = mha_lib.scaled_dot_product_attention(qh, kh, vh)
    merged = mha_lib.merge_heads(head_out)                            # (B, L, d_model)
    output = mha.out_proj(merged)                                     # (B, L, d_model)
    with torch.no_grad():
        module_out, module_weights = mha(x)
    if module_out.shape != output.shape or module_weights.shape != weights.shape:
        raise RuntimeError("the stages and MultiHeadAttention disagree on the shapes")
    d_ff = 4 * d_model  # the transformer's usual feed-forward width
    hidden = nn.Linear(d_model, d_ff)(output)                         # (B, L, d_ff)
    return Shapes(
        batch=ids.shape[0], length=ids.shape[1], d_model=d_model, heads=num_heads,
        head_dim=qh.shape[-1], vocab=len(stoi), d_ff=d_ff,
        ids=tuple(ids.shape), embedded=tuple(embedded.shape), positioned=tuple(x.shape),
        q=tuple(q.shape), q_heads=tuple(qh.shape), weights=tuple(weights.shape),
        head_out=tuple(head_out.shape), merged=tuple(merged.shape),
        output=tuple(output.shape), ffn_hidden=tuple(hidden.shape),
    )


def fmt(shape: Iterable[int]) -> str:
    """(3, 6, 8), as PyTorch prints a shape."""
    return "(" + ", ".join(str(n) for n in shape) + ")"


# --- SVG text ------------------------------------------------------------------------------

class Svg:
    """A small SVG writer: rectangles, text (with sub/superscripts), arrows, paths."""

    def __init__(self, height: int, title: str, desc: str):
        self.height = height
        self.title = title
        self.desc = desc
        self.items: list[str] = []
        self.marker_colors: list[str] = []  # arrowheads in colors other than INK

    def _head(self, stroke: str) -> str:
        """The marker-end attribute of an arrow in ``stroke``'s color."""
        if stroke == INK:
            return ' marker-end="url(#arrow)"'
        if stroke not in self.marker_colors:
            self.marker_colors.append(stroke)
        return f' marker-end="url(#arrow-{stroke.lstrip("#")})"'

    def rect(self, x: float, y: float, w: float, h: float, fill: str = BOX,
             stroke: str = BOX_EDGE, rx: float = 6, width: float = 1.2,
             dash: str | None = None) -> None:
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        self.items.append(
            f'<rect x="{x:g}" y="{y:g}" width="{w:g}" height="{h:g}" rx="{rx:g}" '
            f'fill="{fill}" stroke="{stroke}" stroke-width="{width:g}"{extra}/>')

    def text(self, x: float, y: float, content: str, size: float = 14, anchor: str = "middle",
             family: str = SANS, weight: str = "normal", fill: str = INK,
             italic: bool = False) -> None:
        """``content`` may hold ``^{..}`` and ``_{..}`` for super- and subscripts."""
        style = ' font-style="italic"' if italic else ""
        self.items.append(
            f'<text x="{x:g}" y="{y:g}" font-family="{family}" font-size="{size:g}" '
            f'font-weight="{weight}" text-anchor="{anchor}" fill="{fill}"{style}>'
            f'{_scripts(content, size)}</text>')

    def line(self, x1: float, y1: float, x2: float, y2: float, arrow: bool = True,
             stroke: str = INK, width: float = 1.4, dash: str | None = None) -> None:
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        head = self._head(stroke) if arrow else ""
        self.items.append(
            f'<line x1="{x1:g}" y1="{y1:g}" x2="{x2:g}" y2="{y2:g}" stroke="{stroke}" '
            f'stroke-width="{width:g}"{extra}{head}/>')

    def path(self, d: str, arrow: bool = True, stroke: str = INK, width: float = 1.4) -> None:
        head = self._head(stroke) if arrow else ""
        self.items.append(f'<path d="{d}" fill="none" stroke="{stroke}" '
                          f'stroke-width="{width:g}"{head}/>')

    def circle(self, cx: float, cy: float, r: float, label: str = "+") -> None:
        self.items.append(f'<circle cx="{cx:g}" cy="{cy:g}" r="{r:g}" fill="#ffffff" '
                          f'stroke="{INK}" stroke-width="1.4"/>')
        self.text(cx, cy + 5, label, size=15, weight="bold")

    def render(self) -> str:
        head = (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{self.height}" '
            f'viewBox="0 0 {WIDTH} {self.height}" role="img" '
            f'aria-labelledby="title desc">\n'
            f'<title id="title">{escape(self.title)}</title>\n'
            f'<desc id="desc">{escape(self.desc)}</desc>\n'
            '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" '
            'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
            f'<path d="M 0 0 L 10 5 L 0 10 z" fill="{INK}"/></marker>'
            + "".join(
                f'<marker id="arrow-{c.lstrip("#")}" viewBox="0 0 10 10" refX="9" refY="5" '
                'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
                f'<path d="M 0 0 L 10 5 L 0 10 z" fill="{c}"/></marker>'
                for c in self.marker_colors)
            + '</defs>\n'
            f'<rect x="0" y="0" width="{WIDTH}" height="{self.height}" fill="#ffffff"/>\n'
        )
        return head + "\n".join(self.items) + "\n</svg>\n"


def _scripts(content: str, size: float) -> str:
    """Escape ``content`` and turn ``^{x}`` / ``_{x}`` into shifted, smaller tspans."""
    out, i, small = [], 0, f"{max(size * 0.72, MIN_FONT):g}"
    while i < len(content):
        if content[i] in "^_" and content[i + 1: i + 2] == "{":
            end = content.index("}", i)
            shift = -0.38 * size if content[i] == "^" else 0.25 * size
            out.append(f'<tspan dy="{shift:g}" font-size="{small}">'
                       f'{escape(content[i + 2:end])}</tspan><tspan dy="{-shift:g}">'
                       '\u200b</tspan>')
            i = end + 1
        else:
            j = i
            while j < len(content) and not (content[j] in "^_" and content[j + 1: j + 2] == "{"):
                j += 1
            out.append(escape(content[i:j]))
            i = j
    return "".join(out)


# --- (a) the pipeline, for the introduction ---------------------------------------------------

def pipeline(s: Shapes) -> Svg:
    # Shown 672 px wide (a captioned figure, 0.896 px per unit): notes 13.5 units (12.1 px),
    # sub- and superscripts MIN_FONT (10.0 px).
    stages_1 = [
        ("text", "3 sentences", None),
        ("token ids", "tokenize, vocab", s.ids),
        ("embedding", f"Embedding({s.vocab}, {s.d_model})", s.embedded),
        ("+ positions", "sinusoids", s.positioned),
        ("Q, K, V", "3 projections", s.q),
    ]
    stages_2 = [
        ("split heads", f"H = {s.heads}, d_{{k}} = {s.head_dim}", s.q_heads),
        ("attention", "softmax(QK^{T}/\u221ad_{k})V", s.head_out),
        ("merge heads", "concatenate", s.merged),
        ("W^{O}", "out_proj", s.output),
        ("output", "1 vector / token", s.output),
    ]
    desc = (
        "The running example through multi-head attention, in two rows. Row 1: text "
        f"(3 sentences) becomes token ids of shape {fmt(s.ids)}, embeddings of shape "
        f"{fmt(s.embedded)}, plus positional encodings {fmt(s.positioned)}, then three "
        f"projections Q, K and V, each {fmt(s.q)}. Row 2: each is split into {s.heads} "
        f"heads of d_k = {s.head_dim} features, {fmt(s.q_heads)}; attention per head, "
        f"softmax(Q K^T / sqrt(d_k)) V, gives weights {fmt(s.weights)} and outputs "
        f"{fmt(s.head_out)}; the heads are merged back to {fmt(s.merged)}; the output "
        f"projection W^O gives the output {fmt(s.output)}, one vector per token.")
    svg = Svg(350, "Multi-head attention on the running example, with shapes", desc)
    svg.text(WIDTH / 2, 24, f"The running example: B = {s.batch} sentences, "
             f"L = {s.length} tokens, d_model = {s.d_model}, H = {s.heads} heads",
             size=16, weight="bold")
    box_w, box_h, step, x0 = 136, 58, 152, 3
    for row, (stages, y) in enumerate(((stages_1, 50), (stages_2, 210))):
        for i, (name, note, shape) in enumerate(stages):
            x = x0 + i * step
            hot = name == "attention"
            svg.rect(x, y, box_w, box_h, fill=ACCENT if hot else BOX,
                     stroke=ACCENT_EDGE if hot else BOX_EDGE)
            svg.text(x + box_w / 2, y + 24, name, size=16, weight="bold")
            svg.text(x + box_w / 2, y + 45, note, size=13.5, fill=MUTED)
            if shape is not None:
                svg.text(x + box_w / 2, y + box_h + 20, fmt(shape), size=14, family=MONO,
                         fill=MUTED)
            if i:
                svg.line(x - step + box_w + 1, y + box_h / 2, x - 1, y + box_h / 2)
        if row == 0:
            # Q, K, V go on to row 2: down, back to the left, down into "split heads".
            xe = x0 + 4 * step + box_w / 2
            svg.path(f"M {xe:g} {y + box_h + 28:g} V 180 H {x0 + box_w / 2:g} V 206")
    # The attention weights leave the attention box as a second output.
    xa = x0 + step + box_w / 2
    svg.line(xa, 210 + box_h + 28, xa, 316, dash="4 3")
    svg.text(xa + 8, 334, f"weights {fmt(s.weights)}: one L \u00d7 L map per sentence "
             "and head", size=14, anchor="start", family=SANS, fill=ACCENT_EDGE)
    return svg


# --- (a2) the heads side by side, for the introduction -------------------------------------

HEAD_COLORS = [("#dbeafe", "#1d4ed8"), ("#fde68a", "#b45309"), ("#dcfce7", "#15803d"),
               ("#f3e8ff", "#7e22ce")]


def _grid(svg: Svg, x: float, y: float, rows: int, cols: int, cell: float,
          fills: list[tuple[str, str]]) -> None:
    """A rows x cols matrix of cells; column j is drawn in ``fills[j]`` (fill, edge)."""
    for j in range(cols):
        fill, edge = fills[j]
        for r in range(rows):
            svg.rect(x + j * cell, y + r * cell, cell, cell, fill=fill, stroke=edge,
                     rx=0, width=0.6)
    svg.rect(x, y, cols * cell, rows * cell, fill="none", stroke=INK, rx=0, width=1.2)


def heads_side_by_side(s: Shapes) -> Svg:
    """H heads, each attending on its own d_k columns; concatenated; mixed by W^O."""
    h, d, n, dm = s.heads, s.head_dim, s.length, s.d_model
    if h > len(HEAD_COLORS) or h * d != dm:
        raise ValueError("the figure draws at most 4 heads that tile d_model")
    desc = (
        f"Multi-head attention on one sentence of L = {n} tokens of d_model = {dm} "
        f"features, drawn as matrices. The input X ({n} x {dm}) goes to {h} heads side by "
        f"side. Head i projects X to its own Q_i, K_i and V_i, each {n} x {d} "
        f"(d_k = {d}), computes its own attention weights A_i = softmax(Q_i K_i^T / "
        f"sqrt(d_k)), {n} x {n}, and outputs head_i = A_i V_i, {n} x {d}. The {h} outputs "
        f"are concatenated side by side into a {n} x {dm} matrix, head i in columns "
        f"{d}i to {d}i+{d - 1}, and multiplied by W^O ({dm} x {dm}), which mixes the "
        f"heads: every column of the {n} x {dm} output draws on all {h} heads.")
    svg = Svg(645, f"{h} attention heads side by side, concatenated, then mixed by W^O",
              desc)
    gray = [(BOX, BOX_EDGE)] * dm
    cx, c = WIDTH / 2, 9
    # the input
    svg.text(cx, 22, f"X: one sentence, L \u00d7 d_model = {n} \u00d7 {dm}", size=16,
             weight="bold")
    _grid(svg, cx - dm * c / 2, 32, n, dm, c, gray)
    top = 32 + n * c
    col_w = 172
    gap = (WIDTH - h * col_w) / (h + 1)
    for i in range(h):
        fill, edge = HEAD_COLORS[i]
        x = gap + i * (col_w + gap)
        mid = x + col_w / 2
        svg.line(cx + (i - (h - 1) / 2) * 14, top + 4, mid, 108, stroke=edge)
        svg.rect(x, 112, col_w, 318, fill="#ffffff", stroke=edge, width=1.4)
        svg.text(mid, 132, f"head {i}", size=15, weight="bold", fill=edge)
        svg.text(mid, 157, f"XW_{{{i}}}^{{Q}},  XW_{{{i}}}^{{K}},  XW_{{{i}}}^{{V}}",
                 size=17)
        for k, name in enumerate("QKV"):
            gx = mid - 48 + k * 36
            _grid(svg, gx, 166, n, d, c, [(fill, edge)] * d)
            svg.text(gx + d * c / 2, 166 + n * c + 17, f"{name}_{{{i}}}", size=15)
        svg.text(mid, 260, f"softmax(Q_{{{i}}}K_{{{i}}}^{{T}}/\u221ad_{{k}})", size=15)
        ay = 270
        _grid(svg, mid - n * c / 2 - 30, ay, n, n, c, [(fill, edge)] * n)
        svg.text(mid - 30 + n * c / 2 + 8, ay + 22, f"A_{{{i}}}", size=15, anchor="start",
                 weight="bold")
        svg.text(mid - 30 + n * c / 2 + 8, ay + 40, f"{n} \u00d7 {n}", size=16,
                 anchor="start", fill=MUTED)
        svg.line(mid, ay + n * c + 4, mid, ay + n * c + 24, stroke=edge)
        svg.text(mid + 6, ay + n * c + 19, f"A_{{{i}}}V_{{{i}}}", size=15, anchor="start")
        oy = ay + n * c + 28
        _grid(svg, mid - d * c / 2 - 30, oy, n, d, c, [(fill, edge)] * d)
        svg.text(mid - 30 + d * c / 2 + 8, oy + 22, f"head_{{{i}}}", size=15,
                 anchor="start", weight="bold")
        svg.text(mid - 30 + d * c / 2 + 8, oy + 40, f"{n} \u00d7 {d}", size=16,
                 anchor="start", fill=MUTED)
    # concatenation, W^O, output: one matrix product on the bottom row
    c2, by = 12, 512
    cat_fills = [HEAD_COLORS[j // d] for j in range(dm)]
    cat_x = 90
    svg.rect(gap, 446, WIDTH - 2 * gap, 28, fill=BOX)
    svg.text(cx, 465, f"concatenate side by side: head i fills columns {d}i to "
             f"{d}i + {d - 1}", size=16)
    for i in range(h):
        x = gap + i * (col_w + gap) + col_w / 2
        svg.line(x, 430, x, 444, stroke=HEAD_COLORS[i][1])
    svg.line(cat_x + dm * c2 / 2, 474, cat_x + dm * c2 / 2, by - 4)
    _grid(svg, cat_x, by, n, dm, c2, cat_fills)
    svg.text(cat_x + dm * c2 / 2, by + n * c2 + 18, "Concat(head_{0}, \u2026, "
             f"head_{{{h - 1}}})", size=16, weight="bold")
    svg.text(cat_x + dm * c2 / 2, by + n * c2 + 36, f"{n} \u00d7 {dm}", size=16, fill=MUTED)
    wx = cat_x + dm * c2 + 60
    svg.text(wx - 30, by + n * c2 / 2 + 6, "\u00d7", size=22)
    wo_fill = [("#d1d5db", MUTED)] * dm  # grey: W^O mixes all heads, none's colour
    _grid(svg, wx, by - (dm - n) * c2 / 2, dm, dm, c2, wo_fill)
    svg.text(wx + dm * c2 / 2, by + n * c2 + 18 + (dm - n) * c2 / 2, "W^{O}", size=15,
             weight="bold")
    svg.text(wx + dm * c2 / 2, by + n * c2 + 36 + (dm - n) * c2 / 2,
             f"{dm} \u00d7 {dm}", size=16, fill=MUTED)
    ox = wx + dm * c2 + 60
    svg.text(ox - 30, by + n * c2 / 2 + 6, "=", size=22)
    _grid(svg, ox, by, n, dm, c2, gray)
    svg.text(ox + dm * c2 + 14, by + 22, "output", size=16, weight="bold", anchor="start")
    svg.text(ox + dm * c2 + 14, by + 40, f"{n} \u00d7 {dm}: each column", size=16,
             anchor="start", fill=MUTED)
    svg.text(ox + dm * c2 + 14, by + 58, "mixes all heads", size=16, anchor="start",
             fill=MUTED)
    return svg


@dataclass(frozen=True)
class Lookup:
    """One query scored against three keys, as the introduction's soft lookup."""

    query: tuple[float, ...]
    keys: tuple[tuple[float, ...], ...]
    values: tuple[tuple[float, ...], ...]
    scores: tuple[float, ...]
    weights: tuple[float, ...]
    output: tuple[float, ...]


def lookup() -> Lookup:
    """Scores q . k_j, their softmax and the weighted sum of the values, by torch."""
    q = torch.tensor([1.0, 1.0])
    keys = torch.tensor([[2.0, 0.0], [1.0, -1.0], [-1.0, 0.0]])
    values = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    scores = keys @ q  # (3,)
    weights = torch.softmax(scores, dim=0)  # (3,)
    out = weights @ values  # (2,)
    rows = lambda t: tuple(tuple(r) for r in t.tolist())  # noqa: E731
    return Lookup(tuple(q.tolist()), rows(keys), rows(values), tuple(scores.tolist()),
                  tuple(weights.tolist()), tuple(out.tolist()))


def _vec(v: Iterable[float]) -> str:
    return "(" + ", ".join(f"{x:g}" for x in v) + ")"


def soft_lookup(c: Lookup) -> Svg:
    w = [f"{x:.3f}" for x in c.weights]
    out = "(" + ", ".join(f"{x:.3f}" for x in c.output) + ")"
    desc = (
        f"One query q = {_vec(c.query)} is compared with three keys, "
        + ", ".join(f"k_{j + 1} = {_vec(k)}" for j, k in enumerate(c.keys))
        + ". The dot products q . k_j give the scores "
        + ", ".join(f"{x:g}" for x in c.scores)
        + "; a softmax turns them into the weights " + ", ".join(w)
        + ", which add up to 1; the output is the weighted sum of the values "
        + ", ".join(f"v_{j + 1} = {_vec(v)}" for j, v in enumerate(c.values))
        + f": {out}, mostly v_1.")
    svg = Svg(285, "One query scoring three keys: attention as a soft lookup", desc)
    svg.text(WIDTH / 2, 24, "One query scores every key; the softmax of the scores "
             "weights the values", size=16, weight="bold")
    cols = {"key": 220, "score": 335, "weight": 420, "value": 670}
    head_y, row0, dy = 60, 92, 52
    for name, x, label in (("key", cols["key"], "key k_{j}"),
                           ("score", cols["score"], "score q\u00b7k_{j}"),
                           ("weight", cols["weight"] + 75, "weight (softmax)"),
                           ("value", cols["value"], "value v_{j}")):
        svg.text(x, head_y, label, size=14, weight="bold", fill=MUTED)
    # the query, with a line to each key
    qy = row0 + dy
    svg.rect(20, qy - 26, 110, 52, fill=HOT, stroke=HOT_EDGE)
    svg.text(75, qy - 5, "query q", size=15, weight="bold")
    svg.text(75, qy + 15, _vec(c.query), size=14, family=MONO)
    for j, (k, v, score, weight) in enumerate(zip(c.keys, c.values, c.scores, c.weights)):
        y = row0 + j * dy
        svg.line(130, qy, cols["key"] - 52, y)
        svg.rect(cols["key"] - 50, y - 18, 100, 36)
        svg.text(cols["key"], y + 5, _vec(k), size=14, family=MONO)
        svg.text(cols["score"], y + 5, f"{score:g}", size=15, family=MONO)
        # a track of full length 1 behind a solid bar, so small weights still show
        svg.rect(cols["weight"], y - 12, 110, 24, fill=BOX, stroke=BOX_EDGE, rx=2)
        svg.rect(cols["weight"], y - 12, max(110 * weight, 3), 24, fill=ACCENT_EDGE,
                 stroke=ACCENT_EDGE, rx=2)
        svg.text(cols["weight"] + 116, y + 5, f"{weight:.3f}", size=14,
                 anchor="start", family=MONO)
        svg.rect(cols["value"] - 50, y - 18, 100, 36, fill=GREEN, stroke=GREEN_EDGE)
        svg.text(cols["value"], y + 5, _vec(v), size=14, family=MONO)
    terms = " + ".join(f"{x:.3f}\u00b7v_{{{j + 1}}}" for j, x in enumerate(c.weights))
    svg.text(WIDTH / 2, row0 + 3 * dy + 8, f"output = {terms} = {out}", size=15,
             family=SANS)
    svg.text(WIDTH / 2, row0 + 3 * dy + 32, "(a Python dict needs a key equal to the "
             "query and returns one value; here every key matches a little)", size=13.5, fill=MUTED)
    return svg


# --- (a2) queries, keys and values, chapter 4 ------------------------------------------------

@dataclass(frozen=True)
class Projections:
    """The shapes of chapter 4's three projections, from the running example's module."""

    x: tuple[int, ...]
    weight: tuple[int, ...]     # nn.Linear's (out, in) storage
    bias: tuple[int, ...]
    outputs: dict[str, tuple[int, ...]]
    parameters: int


def projections() -> Projections:
    """Run the running example's ``x`` through ``q_proj``, ``k_proj`` and ``v_proj``."""
    _, _, _, x, mha = example()
    layers = {"Q": mha.q_proj, "K": mha.k_proj, "V": mha.v_proj}
    with torch.no_grad():
        outputs = {name: tuple(layer(x).shape) for name, layer in layers.items()}
    return Projections(
        x=tuple(x.shape), weight=tuple(mha.q_proj.weight.shape),
        bias=tuple(mha.q_proj.bias.shape), outputs=outputs,
        parameters=sum(p.numel() for layer in layers.values() for p in layer.parameters()))


def qkv(p: Projections) -> Svg:
    d_in, d_out = p.weight[1], p.weight[0]
    roles = {"Q": ("query", "what each token looks for"),
             "K": ("key", "what each token offers"),
             "V": ("value", "what each token hands over")}
    desc = (
        f"The input x of shape {fmt(p.x)} (B sentences, L tokens, d_model features) goes "
        "through three separate learned linear layers, q_proj, k_proj and v_proj, each "
        f"nn.Linear({d_in}, {d_out}) with a weight matrix of {d_in} x {d_out} and a bias of "
        f"{p.bias[0]}: Q = x W^Q + b^Q, K = x W^K + b^K, V = x W^V + b^V. The outputs Q, K "
        f"and V have shapes {fmt(p.outputs['Q'])}, {fmt(p.outputs['K'])} and "
        f"{fmt(p.outputs['V'])}: the query (what each token looks for), the key (what it "
        "offers) and the value (what it hands over). W^Q is q_proj.weight transposed; the "
        f"three layers hold {p.parameters} parameters.")
    svg = Svg(300, "One input, three learned projections: x to Q, K and V, with shapes",
              desc)
    svg.text(WIDTH / 2, 24, "Every token of x is projected three times, by three "
             "different layers", size=16, weight="bold")
    # x, on the left
    svg.rect(14, 112, 140, 76, fill=BOX)
    svg.text(84, 140, "x", size=18, weight="bold")
    svg.text(84, 162, fmt(p.x), size=14, family=MONO)
    svg.text(84, 180, "(B, L, d_model)", size=13, fill=MUTED)
    for i, name in enumerate("QKV"):
        y = 50 + i * 72  # top of this row
        mid = y + 29
        low = name.lower()
        # the layer
        svg.line(155, 150, 224, mid)
        svg.rect(226, y, 250, 58, fill=HOT, stroke=HOT_EDGE)
        svg.text(351, y + 23, f"{low}_proj = nn.Linear({d_in}, {d_out})", size=14,
                 family=MONO, weight="bold")
        svg.text(351, y + 45, f"{name} = x W^{{{name}}} + b^{{{name}}}", size=15)
        # the output
        svg.line(477, mid, 514, mid)
        svg.rect(516, y, 222, 58, fill=BOX)
        svg.text(530, y + 23, f"{name}  {fmt(p.outputs[name])}", size=15, family=MONO,
                 weight="bold", anchor="start")
        svg.text(530, y + 45, roles[name][1], size=13.5, fill=MUTED, anchor="start")
    svg.text(WIDTH / 2, 284, f"W^{{Q}} = q_proj.weight.T: weight {fmt(p.weight)} stored "
             f"(out, in), bias ({p.bias[0]},); {p.parameters} parameters in all",
             size=15)
    return svg


# --- (b) the "you are here" strip of chapters 1-11 -----------------------------------------

STRIP_STAGES = ["text", "ids", "embed", "+ pos", "Q K V", "heads", "attention",
                "merge", "W^{O}"]

# chapter: (highlighted stages, caption, bracket label over the module or None)
CHAPTERS: dict[int, tuple[tuple[str, ...], str, str | None]] = {
    1: (("text", "ids"), "Chapter 1: text to token ids", None),
    2: (("embed",), "Chapter 2: embeddings", None),
    3: (("+ pos",), "Chapter 3: positional encoding", None),
    4: (("Q K V",), "Chapter 4: queries, keys and values", None),
    5: (("heads",), "Chapter 5: splitting into heads", None),
    6: (("attention",), "Chapter 6: scaled dot-product attention", None),
    7: (("attention",), "Chapter 7: attention with a mask", None),
    8: (("merge", "W^{O}"), "Chapter 8: merge, W^O and the full module",
        "MultiHeadAttention"),
    9: ((), "Chapter 9: the whole module, as d2l writes it", "D2LMultiHeadAttention"),
    10: ((), "Chapter 10: the whole module, with einsum and einops",
          "EinsumMultiHeadAttention"),
    11: ((), "Chapter 11: the whole module, checked against PyTorch",
          "= nn.MultiheadAttention"),
}


def _strip_shapes(s: Shapes, chapter: int = 0) -> dict[str, tuple[int, ...] | None]:
    """The shapes under the strip's boxes: the running example's, except in the
    chapters that work on other shapes (7: its padded batch of 4; 9 and 10)."""
    if chapter == 9:
        return _d2l_strip_shapes(s)
    if chapter == 10:
        return _einsum_strip_shapes(s)
    if chapter == 7:  # chapter 7's padded batch: the 3 sentences + 1
        return {stage: shape and (s.batch + 1, *shape[1:])
                for stage, shape in _strip_shapes(s).items()}
    return {"text": None, "ids": s.ids, "embed": s.embedded, "+ pos": s.positioned,
            "Q K V": s.q, "heads": s.q_heads, "attention": s.head_out, "merge": s.merged,
            "W^{O}": s.output}


def _d2l_strip_shapes(s: Shapes) -> dict[str, tuple[int, ...] | None]:
    """Chapter 9: chapter 7's padded batch (the 3 sentences + "What is next?") through
    D2LMultiHeadAttention, heads folded into the batch, (B*H, L, D)."""
    import mha_lib
    from mha_lib.exercises import SENTENCES

    stoi = mha_lib.build_vocab(SENTENCES, specials=("<pad>",))
    ids, lens = mha_lib.encode([*SENTENCES, "What is next?"], stoi, pad_id=0)  # (B, L)
    with torch.random.fork_rng(), torch.no_grad():
        d2l = mha_lib.D2LMultiHeadAttention(s.d_model, s.d_model, s.d_model, s.d_model,
                                            s.heads, dropout=0.0)
        x = torch.zeros(*ids.shape, s.d_model)                        # (B, L, d_model)
        q = d2l.W_q(x)                                                # (B, L, d_model)
        folded = mha_lib.transpose_qkv(q, s.heads)                    # (B*H, L, D)
        attended = d2l.attention(folded, folded, folded,
                                 torch.repeat_interleave(lens, s.heads))  # (B*H, L, D)
        merged = mha_lib.transpose_output(attended, s.heads)          # (B, L, d_model)
        output = d2l(x, x, x, lens)                                   # (B, L, d_model)
    return {"text": None, "ids": tuple(ids.shape), "embed": tuple(x.shape),
            "+ pos": tuple(x.shape), "Q K V": tuple(q.shape), "heads": tuple(folded.shape),
            "attention": tuple(attended.shape), "merge": tuple(merged.shape),
            "W^{O}": tuple(output.shape)}


def _einsum_strip_shapes(s: Shapes, d_k: int = 3, d_v: int = 5
                         ) -> dict[str, tuple[int, ...] | None]:
    """Chapter 10: EinsumMultiHeadAttention with d_k = 3, d_v = 5, heads first,
    (H, B, L, d_k); the box "Q K V" shows the queries' (and keys') H * d_k
    features, and "V" the values' H * d_v."""
    import mha_lib
    from einops import rearrange

    with torch.random.fork_rng(), torch.no_grad():
        m = mha_lib.EinsumMultiHeadAttention(s.heads, s.d_model, d_k, d_v, dropout=0.0)
        x = torch.zeros(s.batch, s.length, s.d_model)                # (B, L, d_model)
        q = m.w_qs(x)                                                 # (B, L, H*d_k)
        q_heads = rearrange(q, "b l (head k) -> head b l k", head=s.heads)
        v_heads = rearrange(m.w_vs(x), "b t (head v) -> head b t v", head=s.heads)
        output, attn = m(x, x, x)                                     # (B, L, d_model)
        attended = torch.einsum("hblt,hbtv->hblv", attn, v_heads)     # (H, B, L, d_v)
        merged = rearrange(attended, "head b l v -> b l (head v)")    # (B, L, H*d_v)
    return {"text": None, "ids": s.ids, "embed": s.embedded, "+ pos": s.positioned,
            "Q K V": tuple(q.shape), "V": tuple(m.w_vs(x).shape),
            "heads": tuple(q_heads.shape),
            "attention": tuple(attended.shape), "merge": tuple(merged.shape),
            "W^{O}": tuple(output.shape)}


def _plain(stage: str) -> str:
    return stage.replace("^{O}", "^O").replace("+ pos", "+ positions").replace(
        "embed", "embeddings").replace("heads", "split heads")


def strip_alt(chapter: int, s: Shapes | None = None) -> str:
    """The alt text of chapter ``chapter``'s strip: where the chapter sits in the pipeline."""
    s = s or running_example()
    hot, caption, module = CHAPTERS[chapter]
    shapes = _strip_shapes(s, chapter)
    stages = ", ".join(_plain(st) + (f" {fmt(shapes[st])}" if shapes[st] else "")
                       for st in STRIP_STAGES)
    if shapes.get("V"):  # chapter 10: d_v != d_k
        stages = stages.replace(f"Q K V {fmt(shapes['Q K V'])}",
                                f"Q K V: Q and K {fmt(shapes['Q K V'])}, "
                                f"V {fmt(shapes['V'])}")
    where = (f"this chapter covers {' and '.join(_plain(h) for h in hot)}" if hot else "")
    if module:
        where += ("; " if where else "this chapter covers ") + (
            f"the whole module from Q K V to W^O ({module.lstrip('= ')})")
    if chapter == 7:
        where += ", with a mask"
    return (f"Where chapter {chapter} sits in multi-head attention: {stages}; "
            f"{where}.")


def strip(chapter: int, s: Shapes) -> Svg:
    hot, caption, module = CHAPTERS[chapter]
    shapes = _strip_shapes(s, chapter)
    extra = 16 if shapes.get("V") else 0  # chapter 10: a line for V's shape
    svg = Svg((118 if module else 96) + extra,
              f"You are here: {caption.replace('^{O}', '^O')}", strip_alt(chapter, s))
    top = 46 if module else 26
    svg.text(8, 18, caption.replace("W^O", "W^{O}"), size=14, anchor="start",
             weight="bold")
    n = len(STRIP_STAGES)
    step, box_w, box_h, x0 = (WIDTH - 12) / n, 70, 34, 8
    for i, stage in enumerate(STRIP_STAGES):
        x = x0 + i * step
        on = stage in hot
        svg.rect(x, top, box_w, box_h, fill=HOT if on else BOX,
                 stroke=HOT_EDGE if on else BOX_EDGE, width=2 if on else 1.1, rx=5)
        svg.text(x + box_w / 2, top + 22, stage, size=13,
                 weight="bold" if on else "normal")
        if shapes[stage]:
            svg.text(x + box_w / 2, top + box_h + 16, fmt(shapes[stage]).replace(" ", ""),
                     size=13.5, family=MONO, fill=HOT_EDGE if on else MUTED)
        if stage == "Q K V" and shapes.get("V"):
            svg.text(x + box_w / 2, top + box_h + 32,
                     "V" + fmt(shapes["V"]).replace(" ", ""), size=13.5,
                     family=MONO, fill=MUTED)
        if i:
            svg.line(x - step + box_w + 1, top + box_h / 2, x - 1, top + box_h / 2,
                     width=1.1)
    if chapter == 7:
        x = x0 + STRIP_STAGES.index("attention") * step
        svg.text(x + box_w / 2, top - 6, "+ mask", size=12.5, weight="bold", fill=HOT_EDGE)
    if module:
        first = x0 + STRIP_STAGES.index("Q K V") * step
        last = x0 + (n - 1) * step + box_w
        y = top - 10
        svg.path(f"M {first:g} {y + 6:g} V {y:g} H {last:g} V {y + 6:g}", arrow=False,
                 stroke=HOT_EDGE, width=2)
        svg.text((first + last) / 2, y - 5, module, size=13, family=MONO, fill=HOT_EDGE,
                 weight="bold")
    return svg


# --- (c) multi-head attention, chapter 8 -------------------------------------------------------

def multi_head(s: Shapes) -> Svg:
    h, d = s.heads, s.head_dim
    desc = (
        f"Multi-head attention with {h} heads on the running example. The input X "
        f"{fmt(s.positioned)} is projected by W^Q, W^K and W^V to Q, K and V, each "
        f"{fmt(s.q)}. Each is cut into {h} heads of {d} features: head i gets Q_i, K_i "
        f"and V_i, each {fmt((s.batch, s.length, d))}, and runs its own scaled dot-product "
        f"attention, with weights {fmt((s.batch, s.length, s.length))} per head and an "
        f"output {fmt((s.batch, s.length, d))}. The {h} head outputs are concatenated "
        f"back to {fmt(s.merged)} and projected by W^O to the output {fmt(s.output)}.")
    svg = Svg(452, f"Multi-head attention: {h} heads side by side, concatenated, "
              "projected by W^O", desc)
    cx = WIDTH / 2
    svg.rect(cx - 120, 10, 240, 38, fill=BOX)
    svg.text(cx, 35, f"X  {fmt(s.positioned)}", size=15, family=MONO)
    svg.line(cx, 48, cx, 66)
    col_w, gap = 160, (WIDTH - 4 * 160) / 5
    # as wide as the four head columns, so that every arrow leaves from it
    svg.rect(gap, 68, WIDTH - 2 * gap, 40, fill=GREEN, stroke=GREEN_EDGE)
    svg.text(cx, 87, "Q = XW^{Q},   K = XW^{K},   V = XW^{V}", size=15, weight="bold")
    svg.text(cx, 104, f"each {fmt(s.q)}; head i takes its own {d} of the {s.d_model} columns",
             size=13.5, fill=MUTED)
    for i in range(h):
        x = gap + i * (col_w + gap)
        mid = x + col_w / 2
        svg.line(mid, 108, mid, 132)
        svg.rect(x, 134, col_w, 44, fill=BOX)
        svg.text(mid, 153, f"Q_{{{i}}}, K_{{{i}}}, V_{{{i}}}", size=14,
                 weight="bold")
        svg.text(mid, 172, fmt((s.batch, s.length, d)), size=13, family=MONO, fill=MUTED)
        svg.line(mid, 178, mid, 200)
        svg.rect(x, 202, col_w, 70, fill=ACCENT, stroke=ACCENT_EDGE)
        svg.text(mid, 222, f"head {i}: attention", size=14, weight="bold")
        svg.text(mid, 242, f"softmax(Q_{{{i}}}K_{{{i}}}^{{T}}/\u221aD) V_{{{i}}}",
                 size=13.5)
        svg.text(mid, 263, f"weights {fmt((s.batch, s.length, s.length))}", size=12.5,
                 family=MONO, fill=ACCENT_EDGE)
        svg.line(mid, 272, mid, 294)
        svg.text(mid, 310, f"out {fmt((s.batch, s.length, d))}", size=13, family=MONO,
                 fill=MUTED)
        svg.line(mid, 316, mid, 336)
    svg.rect(gap, 338, WIDTH - 2 * gap, 34, fill=BOX)
    svg.text(cx, 360, f"concatenate the {h} heads (merge_heads): {fmt(s.merged)}", size=14)
    svg.line(cx, 372, cx, 390)
    svg.rect(cx - 170, 392, 340, 52, fill=GREEN, stroke=GREEN_EDGE)
    svg.text(cx, 414, "W^{O}  (out_proj)", size=15, weight="bold")
    svg.text(cx, 434, f"output {fmt(s.output)}", size=13, family=MONO)
    return svg


# --- (c2) one head's attention as matrices, chapter 6 ------------------------------------------

def sdpa(s: Shapes) -> Svg:
    """Q K^T -> scores -> scale and softmax per row -> weights times V, for one sentence
    and one head of the running example (the last two axes of each tensor)."""
    L, d = s.length, s.head_dim
    desc = (
        f"Scaled dot-product attention for one sentence and one head of the running "
        f"example, as matrices: Q ({L} x {d}) times K transposed ({d} x {L}) gives the "
        f"scores S ({L} x {L}), one per query and key; dividing by the square root of "
        f"d_k = {d} and taking the softmax of each row gives the weights A ({L} x {L}), "
        f"whose rows sum to 1; A times V ({L} x {d}) gives the output ({L} x {d}), one "
        f"row per query. The batch axes (B, H) = ({s.batch}, {s.heads}) come along: "
        f"every sentence and head does the same.")
    svg = Svg(214, "Scaled dot-product attention for one head, as matrices", desc)
    svg.text(WIDTH / 2, 24, f"One sentence, one head; the batch axes (B, H) = "
             f"({s.batch}, {s.heads}) come along", size=15, weight="bold")
    cell, top = 13, 52
    mats = [  # name, note, rows, cols, fill, edge, gap after, what the gap holds
        ("Q", "queries", L, d, ACCENT, ACCENT_EDGE, 34, "dot"),
        ("K^{T}", "keys", d, L, GREEN, GREEN_EDGE, 56, "arrow"),
        ("S = QK^{T}", "scores", L, L, BOX, BOX_EDGE, 150, "softmax"),
        ("A", "rows sum to 1", L, L, HOT, HOT_EDGE, 34, "dot"),
        ("V", "values", L, d, "#f3e8ff", "#7e22ce", 56, "arrow"),
        ("A V", "output", L, d, ACCENT, ACCENT_EDGE, 0, None),
    ]
    total = sum(c * cell + g for _, _, _, c, _, _, g, _ in mats)
    x = (WIDTH - total) / 2
    mid = top + L * cell / 2
    for name, note, rows, cols, fill, edge, gap, between in mats:
        w, h = cols * cell, rows * cell
        _grid(svg, x, mid - h / 2, rows, cols, cell, [(fill, edge)] * cols)
        cx = x + w / 2
        svg.text(cx, top + L * cell + 24, name, size=15, weight="bold")
        svg.text(cx, top + L * cell + 43, f"{rows} \u00d7 {cols}", size=14, family=MONO,
                 fill=MUTED)
        svg.text(cx, top + L * cell + 63, note, size=15, fill=MUTED)
        x += w
        if between == "dot":
            svg.text(x + gap / 2, mid + 6, "\u00b7", size=22, weight="bold")
        elif between == "arrow":
            svg.line(x + 8, mid, x + gap - 8, mid)
        elif between == "softmax":
            svg.line(x + 8, mid, x + gap - 8, mid, stroke=HOT_EDGE)
            svg.text(x + gap / 2, mid - 27, "\u00f7 \u221ad_{k}, then", size=15,
                     fill=HOT_EDGE)
            svg.text(x + gap / 2, mid - 9, "softmax per row", size=15, fill=HOT_EDGE)
        x += gap
    return svg


# --- (d) the transformer block, chapter 12 -----------------------------------------------------

def block(s: Shapes) -> Svg:
    x_shape, hid = fmt(s.output), fmt(s.ffn_hidden)
    desc = (
        "Two transformer blocks side by side, both mapping x of shape "
        f"{x_shape} to an output of the same shape. Left, pre-norm (GPT-2; Llama has "
        "the same order with RMSNorm in place of LayerNorm): x goes through "
        "LayerNorm, then multi-head attention, and is added back to x (a residual "
        "connection); that sum goes through LayerNorm, then the feed-forward network, whose "
        "output is added to that sum. Right, post-norm (the original transformer): x goes "
        "through multi-head attention, is added to x, then LayerNorm; then the "
        "feed-forward network, added to its input, then LayerNorm. In both, dropout acts "
        "on each sublayer's output just before it is added. A pre-norm stack ends with "
        "one final LayerNorm after its last block (dashed). A bracket marked "
        "\u00d7 N beside each block says that a model stacks N of them. The feed-forward "
        f"network is Linear {s.d_model} to {s.d_ff}, an activation, Linear {s.d_ff} to "
        f"{s.d_model}; its hidden shape is {hid}.")
    svg = Svg(620, "The transformer block: pre-norm and post-norm", desc)
    ffn_lines = (f"FFN: Linear {s.d_model}\u2192{s.d_ff}", f"activation on {hid}",
                 f"Linear {s.d_ff}\u2192{s.d_model}")

    def column(x: float, title: str, order: list[str]) -> None:
        mid, w = x + 150, 190
        svg.text(mid, 24, title, size=15, weight="bold")
        svg.text(mid, 52, f"x  {x_shape}", size=14, family=MONO)
        y = 58
        branch = y
        top = bottom = None  # the span of one block, bracketed "× N"
        for step in order:
            if step == "branch" and top is None:
                top = y
            if step == "LNf":
                bottom = y
            if step == "branch":  # the residual leaves the main line here
                svg.line(mid, y, mid, y + 8, arrow=False)
                y += 8
                branch = y
                svg.items.append(f'<circle cx="{mid:g}" cy="{y:g}" r="3" fill="{INK}"/>')
                continue
            if step == "+":  # ... and comes back here: along the right, into the sum
                svg.line(mid, y, mid, y + 14)
                svg.circle(mid, y + 28, 13)
                svg.path(f"M {mid:g} {branch:g} H {mid + w / 2 + 40:g} "
                         f"V {y + 28:g} H {mid + 15:g}")
                y += 41
                continue
            svg.line(mid, y, mid, y + 18)
            if step == "D":  # dropout on the sublayer's output
                svg.rect(mid - 50, y + 20, 100, 26, fill="#ffffff", dash="4 3")
                svg.text(mid, y + 38, "dropout", size=13)
                y += 46
            elif step == "LNf":  # once, after the last block of a stack
                svg.rect(mid - w / 2, y + 20, w, 46, fill=BOX, dash="5 4")
                svg.text(mid, y + 39, "final LayerNorm", size=14)
                svg.text(mid, y + 57, "(after the last block only)", size=12.5)
                y += 66
            elif step == "LN":
                svg.rect(mid - w / 2, y + 20, w, 34, fill=BOX)
                svg.text(mid, y + 42, "LayerNorm", size=14)
                y += 54
            elif step == "MHA":
                svg.rect(mid - w / 2, y + 20, w, 40, fill=ACCENT, stroke=ACCENT_EDGE)
                svg.text(mid, y + 45, "multi-head attention", size=14, weight="bold")
                y += 60
            else:
                svg.rect(mid - w / 2, y + 20, w, 74, fill=GREEN, stroke=GREEN_EDGE)
                for k, label in enumerate(ffn_lines):
                    svg.text(mid, y + 41 + 21 * k, label, size=13.5,
                             weight="bold" if k == 0 else "normal")
                y += 94
        bottom = y if bottom is None else bottom
        left = mid - w / 2 - 22  # the stack: N such blocks, one after another
        svg.path(f"M {left + 8:g} {top:g} H {left:g} V {bottom:g} H {left + 8:g}",
                 arrow=False, width=1.2)
        svg.text(left - 4, (top + bottom) / 2 + 5, "\u00d7 N", size=14, anchor="end",
                 weight="bold")
        svg.line(mid, y, mid, y + 20)
        svg.text(mid, y + 36, f"output  {x_shape}", size=14, family=MONO)

    column(45, "pre-norm (GPT-2 and later LLMs)",
           ["branch", "LN", "MHA", "D", "+", "branch", "LN", "FFN", "D", "+",
            "LNf"])
    column(405, "post-norm (the 2017 transformer)",
           ["branch", "MHA", "D", "+", "LN", "branch", "FFN", "D", "+", "LN"])
    svg.line(375, 12, 375, 608, arrow=False, stroke=BOX_EDGE, width=1, dash="5 4")
    return svg


# --- (e) tiling and the online softmax, chapter 13 ------------------------------------------

@dataclass(frozen=True)
class OnlineSoftmax:
    """One query row of the running example through the tiled attention of chapter 13."""

    sentence: int
    head: int
    position: int
    block: int
    length: int
    head_dim: int
    block_max: tuple[float, ...]    # rowmax of the row's scores in each key block
    running_max: tuple[float, ...]  # m after each block
    correction: tuple[float, ...]   # e^(m - m') applied to l and o at each block
    running_sum: tuple[float, ...]  # l after each block
    output: tuple[float, ...]       # o / l at the end (D numbers)


def online_softmax(block: int = 2) -> OnlineSoftmax:
    """Run the online softmax over key blocks for every query row of the running example
    (one head at a time), check it against mha_lib's attention, and keep the row
    (sentence, head, query position of the second query block) where one later block
    leaves the maximum unchanged (rescale factor 1) and another raises it most (the
    smallest factor), so that the figure shows both cases. The module is chapter 13's."""
    import math

    import mha_lib

    _, _, _, x, _ = example()
    torch.manual_seed(1)  # chapter 13's module: its seeds, 0 then 1
    mha = mha_lib.MultiHeadAttention(d_model=8, num_heads=4).eval()
    with torch.no_grad():
        q, k, v = (mha_lib.split_heads(p(x), mha.num_heads)
                   for p in (mha.q_proj, mha.k_proj, mha.v_proj))   # (B, H, L, D)
        expected, _ = mha_lib.scaled_dot_product_attention(q, k, v)  # (B, H, L, D)
    B, H, L, D = q.shape
    scores = q @ k.transpose(-2, -1) / math.sqrt(D)                  # (B, H, L, L)
    m = torch.full((B, H, L, 1), float("-inf"), dtype=torch.float64)
    total = torch.zeros(B, H, L, 1, dtype=torch.float64)
    o = torch.zeros(B, H, L, D, dtype=torch.float64)
    maxes, runs, corrections, sums = [], [], [], []
    for j in range(0, L, block):
        s = scores[..., j:j + block].double()                        # (B, H, L, block)
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        p = torch.exp(s - m_new)
        correction = torch.exp(m - m_new)
        total = correction * total + p.sum(-1, keepdim=True)
        o = correction * o + p @ v[..., j:j + block, :].double()
        maxes.append(s.amax(-1, keepdim=True))
        runs.append(m_new)
        corrections.append(correction)
        sums.append(total)
        m = m_new
    out = (o / total).float()
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)
    first_block_rows = range(block, 2 * block)  # the query block of the figure
    best, pick = 1.0, None
    for b in range(B):
        for h in range(H):
            for r in first_block_rows:
                factors = [float(t[b, h, r]) for t in corrections[1:]]
                if 1.0 in factors and min(factors) < best:
                    best, pick = min(factors), (b, h, r)
    if pick is None:
        raise RuntimeError("no query row with one block that leaves the maximum")
    b, h, r = pick
    return OnlineSoftmax(
        b, h, r, block, L, D, tuple(float(t[b, h, r]) for t in maxes),
        tuple(float(t[b, h, r]) for t in runs),
        tuple(float(t[b, h, r]) for t in corrections),
        tuple(float(t[b, h, r]) for t in sums),
        tuple(float(t) for t in out[b, h, r]))


def tiles_at(length: int, block: int) -> tuple[int, int]:
    """(tiles, tiles computed with a causal mask) for ``length`` tokens in blocks."""
    n = -(-length // block)
    return n * n, n * (n + 1) // 2


def tiling(r: OnlineSoftmax) -> Svg:
    n = r.length // r.block
    tiles, causal = tiles_at(r.length, r.block)
    big_tiles, big_causal = tiles_at(1000, 128)
    row = 1  # the query block the figure follows
    desc = (
        f"Tiled attention on the running example: L = {r.length} queries and keys of one "
        f"head, in blocks of {r.block}. The {r.length} by {r.length} score matrix is cut "
        f"into {tiles} tiles of {r.block} by {r.block}. Query block Q_{row} meets key/value "
        f"blocks K_0 V_0, K_1 V_1, K_2 V_2 one after another; each of its query rows "
        "carries a running maximum m, a running sum l and a running output o. For each "
        "block: S = Q K_j^T / sqrt(D), m' = max(m, rowmax S), P = exp(S - m'), "
        "l' = exp(m - m') l + rowsum P, o' = exp(m - m') o + P V_j; at the end the output "
        f"is o / l. With a causal mask the {tiles - causal} tiles above the diagonal "
        f"(dashed) would never be computed; this example has no mask, so Q_{row} meets "
        "all three blocks. Only one tile of {r.block * r.block} scores is held at a time, "
        f"never the {r.length * r.length} of the whole matrix. For query {r.position} of "
        f"sentence {r.sentence}, head {r.head}, the block maxima are "
        + ", ".join(f"{a:.2f}" for a in r.block_max) + "; the running maximum is "
        + ", ".join(f"{a:.2f}" for a in r.running_max) + ", so l and o are rescaled by "
        + ", ".join(f"{a:.2f}" for a in r.correction[1:]) + " (a factor of 1 where a "
        "block leaves the maximum unchanged); the output o / l equals "
        "the library's attention within 1e-6. At L = 1000 with blocks of 128: 16,384 "
        f"scores per tile instead of 1,000,000, and a causal mask computes {big_causal} of "
        f"the {big_tiles} tiles.")
    svg = Svg(522, "Tiled attention with an online softmax: the L x L matrix is never "
              "stored", desc)
    svg.text(WIDTH / 2, 24, f"Tiled attention on the running example: L = {r.length}, "
             f"blocks of {r.block}, one head (D = {r.head_dim})", size=15, weight="bold")
    # Left: the score matrix in tiles.
    gx, gy, cell = 62, 100, 34
    tile = cell * r.block
    svg.text(gx + n * tile / 2, 56, "key/value blocks", size=13.5, fill=MUTED)
    for j in range(n):
        svg.text(gx + (j + 0.5) * tile, 82, f"K_{{{j}}} V_{{{j}}}", size=14, weight="bold")
    for i in range(n):
        svg.text(gx - 10, gy + (i + 0.5) * tile + 5, f"Q_{{{i}}}", size=14, weight="bold",
                 anchor="end")
        for j in range(n):
            x, y = gx + j * tile, gy + i * tile
            future = j > i
            fill = ACCENT if i == row else ("#ffffff" if future else BOX)
            svg.rect(x, y, tile, tile, fill=fill, rx=0,
                     stroke=ACCENT_EDGE if i == row else BOX_EDGE,
                     width=1.6 if i == row else 1.1, dash="5 3" if future else None)
            for c in range(1, r.block):  # the cells of the tile: one score each
                svg.line(x + c * cell, y, x + c * cell, y + tile, arrow=False,
                         stroke=BOX_EDGE, width=0.6)
                svg.line(x, y + c * cell, x + tile, y + c * cell, arrow=False,
                         stroke=BOX_EDGE, width=0.6)
    yr = gy + (row + 0.5) * tile
    svg.line(gx + tile / 2 + 13, yr, gx + (n - 0.5) * tile - 15, yr, stroke=ACCENT_EDGE)
    for j in range(n):
        cx = gx + (j + 0.5) * tile
        svg.items.append(f'<circle cx="{cx:g}" cy="{yr:g}" r="12" fill="#ffffff" '
                         f'stroke="{ACCENT_EDGE}" stroke-width="1.4"/>')
        svg.text(cx, yr + 5, str(j + 1), size=14, weight="bold", fill=ACCENT_EDGE)
    ly = gy + n * tile + 24
    svg.rect(gx - 40, ly - 11, 14, 14, fill=ACCENT, stroke=ACCENT_EDGE, rx=2)
    svg.text(gx - 20, ly + 1, f"Q_{{{row}}}'s tiles, in the order 1, 2, 3", size=13.5,
             anchor="start")
    svg.rect(gx - 40, ly + 11, 14, 14, fill="#ffffff", dash="3 2", rx=2)
    svg.text(gx - 20, ly + 23, f"skipped if causal ({tiles - causal} of {tiles});",
             size=13.5, anchor="start")
    svg.text(gx - 20, ly + 41, f"no mask here: Q_{{{row}}} meets all {n}", size=13.5,
             anchor="start")
    svg.text(gx - 40, ly + 66, f"held at once: one {r.block} \u00d7 {r.block} tile "
             f"({r.block * r.block} scores),", size=13.5, anchor="start")
    svg.text(gx - 40, ly + 84, f"never the {r.length} \u00d7 {r.length} matrix "
             f"({r.length * r.length})", size=13.5, anchor="start")
    # Right: the update, and one row's numbers.
    x0 = 330
    svg.text(x0, 56, f"Each query row of Q_{{{row}}} carries three running values:",
             size=13.5, anchor="start", weight="bold")
    svg.text(x0, 76, f"m (max), \u2113 (sum of e^{{S \u2212 m}}), o (sum of P V, "
             f"{r.head_dim} numbers)", size=13.5, anchor="start", fill=MUTED)
    svg.text(x0, 95, "start: m = \u2212\u221e, \u2113 = 0, o = 0", size=13.5, anchor="start",
             fill=MUTED)
    svg.rect(x0 - 6, 106, WIDTH - x0 - 6, 166, fill=ACCENT, stroke=ACCENT_EDGE)
    lines = [
        ("for each block K_{j} V_{j}, in order:", "bold"),
        (f"S = Q_{{{row}}} K_{{j}}^{{T}} / \u221aD     (one tile)", "normal"),
        ("m' = max(m, rowmax S)", "normal"),
        ("P = exp(S \u2212 m')", "normal"),
        ("\u2113' = e^{m \u2212 m'} \u2113 + rowsum P", "normal"),
        ("o' = e^{m \u2212 m'} o + P V_{j}", "normal"),
        ("after the last block: output = o / \u2113", "bold"),
    ]
    for t, (text, weight) in enumerate(lines):
        svg.text(x0 + 6, 127 + 22 * t, text, size=14, anchor="start", weight=weight)
    # The numbers of one row.
    ty = 306
    svg.text(x0, ty, f"Query {r.position} of sentence {r.sentence}, head {r.head}, "
             "no mask:", size=13.5, anchor="start", weight="bold")
    cols = [x0 + 160 + 80 * j for j in range(n)]
    for j, cx in enumerate(cols):
        svg.text(cx, ty + 22, f"K_{{{j}}} V_{{{j}}}", size=13.5, fill=MUTED)
    table = [("rowmax S", r.block_max), ("m", r.running_max),
             ("rescale e^{m \u2212 m'}", (None,) + r.correction[1:]),
             ("\u2113", r.running_sum)]
    for t, (name, values) in enumerate(table):
        y = ty + 45 + 21 * t
        svg.text(x0, y, name, size=13.5, anchor="start")
        for cx, value in zip(cols, values, strict=True):
            label = "\u2013" if value is None else f"{value:.2f}"
            hot = name.startswith("rescale") and value is not None
            svg.text(cx, y, label, size=13.5, family=MONO,
                     fill=HOT_EDGE if hot else INK, weight="bold" if hot else "normal")
    out = ", ".join(f"{a:.2f}" for a in r.output)
    svg.text(x0, ty + 142, f"o / \u2113 = ({out}), the library's output for", size=13.5,
             anchor="start")
    svg.text(x0, ty + 160, "this row (equal within 1e-6)", size=13.5, anchor="start")
    svg.line(12, 486, WIDTH - 12, 486, arrow=False, stroke=BOX_EDGE, width=1)
    svg.text(WIDTH / 2, 508, f"At L = 1,000, blocks of 128: {128 * 128:,} scores per tile, "
             f"not {1000 * 1000:,}; a causal mask computes {big_causal} of {big_tiles} "
             "tiles.",
             size=13.5, fill=MUTED)
    return svg


# --- (f) the KV cache and grouped-query attention, chapter 14 ---------------------------------

PAIR_COLORS = [(ACCENT, ACCENT_EDGE), (HOT, HOT_EDGE), (GREEN, GREEN_EDGE),
               ("#ede9fe", "#6d28d9")]


@dataclass(frozen=True)
class CacheStep:
    """One decoding step of the running example with a KVCache, as mha_lib runs it."""

    step: int
    length: int
    new_token: tuple[int, ...]
    query: tuple[int, ...]
    cached_before: tuple[int, ...]
    cached_after: tuple[int, ...]
    weights: tuple[int, ...]
    output: tuple[int, ...]
    row: tuple[float, ...]   # the new query's weights, sentence 0, head 0


def cache_step(step: int = 3) -> CacheStep:
    """Decode the running example token by token with ``MultiHeadAttention`` and a
    ``KVCache`` up to ``step``; record the shapes of that step and check its output
    against the full causal pass."""
    import mha_lib

    _, _, _, x, _ = example()
    torch.manual_seed(1)  # chapter 14's module: its seeds, 0 then 1
    mha = mha_lib.MultiHeadAttention(x.size(-1), 4).eval()
    cache = mha_lib.KVCache()
    with torch.no_grad():
        for t in range(step):
            mha(x[:, t:t + 1], cache=cache)
        before = tuple(cache.keys[0].shape)
        new = x[:, step:step + 1]                                     # (B, 1, d_model)
        q = mha_lib.split_heads(mha.q_proj(new), mha.num_heads)       # (B, H, 1, D)
        out, weights = mha(new, cache=cache)          # (B, 1, d_model), (B, H, 1, t + 1)
        full, _ = mha(x, mask=mha_lib.causal_mask(x.size(1)))
    torch.testing.assert_close(out, full[:, step:step + 1], atol=1e-6, rtol=0)
    row = tuple(float(w) for w in weights[0, 0, 0])
    return CacheStep(step, x.size(1), tuple(new.shape), tuple(q.shape), before,
                     tuple(cache.keys[0].shape), tuple(weights.shape), tuple(out.shape),
                     row)


def kv_cache(c: CacheStep) -> Svg:
    t, L = c.step, c.length
    row = ", ".join(f"{w:.2f}" for w in c.row)
    desc = (
        f"Decoding step {t} of the running example with a KV cache, positions 0 to {L - 1} "
        f"in columns. Positions 0 to {t - 1} were decoded before: their keys and values "
        f"are in the cache, {fmt(c.cached_before)}; their tokens and queries are not "
        f"needed any more. The new token x_{t}, {fmt(c.new_token)}, is the only one "
        f"projected: its query q_{t}, {fmt(c.query)}, and its key and value, which are "
        f"appended to the cache, now {fmt(c.cached_after)}. The query attends to all "
        f"{t + 1} kept positions, with no mask, since the new token is the last position: "
        f"weights {fmt(c.weights)}; for sentence 0, head 0 they are {row}. The output "
        f"for the new token is {fmt(c.output)}. Positions {t + 1} and beyond are not "
        "decoded yet.")
    svg = Svg(386, f"One decoding step with a KV cache: append k_{t}, v_{t}; q_{t} "
              "attends to every kept position", desc)
    svg.text(WIDTH / 2, 24, f"Decoding step {t} with a KV cache (the running example, "
             "one head drawn)", size=15, weight="bold")
    x0, w, gap = 150, 52, 8
    cols = [x0 + i * (w + gap) for i in range(L)]
    svg.text(x0 - 12, 60, "position", size=14, anchor="end", fill=MUTED)
    for i, cx in enumerate(cols):
        svg.text(cx + w / 2, 60, str(i), size=14, fill=MUTED, weight="bold" if i == t
                 else "normal")
    rows = [("token x", 72), ("query q = x W^{Q}", 114), ("key k = x W^{K}", 156),
            ("value v = x W^{V}", 198), (f"weight of q_{{{t}}}", 256)]
    for name, y in rows:
        svg.text(x0 - 12, y + 22, name, size=14, anchor="end")
    for i, cx in enumerate(cols):
        for name, y in rows:
            kind = name.split()[0]
            if i > t:  # not decoded yet
                svg.rect(cx, y, w, 34, fill="#ffffff", stroke=BOX_EDGE, dash="4 3", rx=4)
                continue
            if kind in ("token", "query") and i < t:
                svg.text(cx + w / 2, y + 22, "\u2013", size=14, fill=FADED)
                continue
            if kind == "weight":
                svg.rect(cx, y, w, 34, fill=ACCENT, stroke=ACCENT_EDGE, rx=4)
                svg.text(cx + w / 2, y + 22, f"{c.row[i]:.2f}", size=14, family=MONO)
                continue
            letter = {"token": "x", "query": "q", "key": "k", "value": "v"}[kind]
            new = i == t
            svg.rect(cx, y, w, 34, fill=HOT if new else BOX,
                     stroke=HOT_EDGE if new else BOX_EDGE, width=2 if new else 1.1, rx=4)
            svg.text(cx + w / 2, y + 22, f"{letter}_{{{i}}}", size=14,
                     weight="bold" if new else "normal")
    # The cache: a bracket around the keys and values of positions 0 .. t.
    right = cols[t] + w
    svg.rect(x0 - 6, 150, right - x0 + 12, 88, fill="none", stroke=GREEN_EDGE, width=2,
             dash="6 3")
    xs = cols[-1] + w + 14
    notes = [
        (93, f"{fmt(c.new_token)}: the only token", "projected"),
        (135, f"{fmt(c.query)}", None),
        (184, f"cache {fmt(c.cached_before)}",
         f"+ k_{{{t}}}, v_{{{t}}} \u2192 {fmt(c.cached_after)}"),
        (277, f"{fmt(c.weights)}; sentence 0,", "head 0 shown (sum 1)"),
    ]
    for y, first, second in notes:
        svg.text(xs, y - (9 if second else 0), first, size=14, anchor="start")
        if second:
            svg.text(xs, y + 9.5, second, size=14, anchor="start")
    svg.text(xs, 304, f"no mask: x_{{{t}}} is the last position", size=14,
             anchor="start")
    svg.text(x0 - 6, 316, "output: \u03a3_{j} w_{j} v_{j} per head, "
             f"merged, then W^{{O}} \u2192 {fmt(c.output)}", size=14, anchor="start")
    legend = [(BOX, BOX_EDGE, None, "kept in the cache"),
              (HOT, HOT_EDGE, None, "computed now, appended"),
              ("#ffffff", BOX_EDGE, "3 2", "not decoded yet"),
              ("none", GREEN_EDGE, "4 2", "the cache after this step")]
    for k, (fill, edge, dash, label) in enumerate(legend):
        lx, ly = x0 - 6 + (k % 3) * 190, 338 + (k // 3) * 22
        svg.rect(lx, ly, 14, 14, fill=fill, stroke=edge, dash=dash, rx=2,
                 width=1.6 if k == 3 else 1.2)
        svg.text(lx + 20, ly + 12, label, size=14, anchor="start")
    svg.text(x0 + 184, 372, "\u2013", size=14, fill=FADED)
    svg.text(x0 + 204, 372, "not needed any more", size=14, anchor="start")
    return svg


@dataclass(frozen=True)
class Grouping:
    """A GroupedQueryAttention of the running example's size, as mha_lib builds it."""

    heads: int
    kv_heads: int
    head_dim: int
    kv_proj: tuple[int, ...]       # k_proj.weight's shape (out, in)
    cache: tuple[int, ...]         # the cached keys after the running example
    per_token: int                 # numbers cached per token (keys and values)
    reads: tuple[int, ...]         # the key/value head each query head reads


def grouping(kv_heads: int, d_model: int = 8, heads: int = 4) -> Grouping:
    """Build ``GroupedQueryAttention(8, 4, kv_heads)``, decode the running example into a
    KVCache, and find which key/value head each query head reads (by doubling one
    key/value head's keys and watching which query heads' weights move)."""
    import mha_lib

    _, _, _, x, _ = example(d_model, heads)
    torch.manual_seed(1)
    m = mha_lib.GroupedQueryAttention(d_model, heads, kv_heads).eval()
    cache = mha_lib.KVCache()
    with torch.no_grad():
        m(x, cache=cache, is_causal=True)
        _, base = m(x)                                                # (B, H, L, L)
        reads = []
        for h in range(heads):
            for g in range(kv_heads):
                rows = slice(g * m.head_dim, (g + 1) * m.head_dim)
                m.k_proj.weight[rows] *= 2  # change key/value head g's keys only
                _, moved = m(x)
                m.k_proj.weight[rows] /= 2
                if not torch.allclose(moved[:, h], base[:, h]):
                    reads.append(g)
                    break
    keys = cache.keys[0]
    B, _, L, _ = keys.shape
    per_token = cache.nbytes // (B * L * keys.element_size())
    return Grouping(heads, kv_heads, m.head_dim, tuple(m.k_proj.weight.shape),
                    tuple(keys.shape), per_token, tuple(reads))


def gqa(groups: list[Grouping]) -> Svg:
    names = {groups[0].heads: "multi-head", 1: "multi-query"}
    parts = []
    for g in groups:
        name = names.get(g.kv_heads, "grouped-query")
        parts.append(
            f"{name} attention with {g.kv_heads} key/value heads: query heads "
            + ", ".join(f"{h} reads key/value head {r}" for h, r in enumerate(g.reads))
            + f"; k_proj and v_proj map {g.kv_proj[1]} to {g.kv_proj[0]} numbers; the "
            f"cache holds {fmt(g.cache)} keys, {g.per_token} numbers per token and layer")
    desc = ("Multi-head, grouped-query and multi-query attention side by side, with 4 "
            "query heads of dimension 2 on the running example. " + ". ".join(parts)
            + ". Each key/value head serves g = H / H_kv query heads; query head h "
            "reads key/value head floor(h / g). Numbers are cached per token and per "
            "layer.")
    svg = Svg(322, "Four query heads sharing four, two or one key/value heads", desc)
    panel = WIDTH / len(groups)
    for p, g in enumerate(groups):
        x0 = p * panel
        mid = x0 + panel / 2
        group = g.heads // g.kv_heads
        name = names.get(g.kv_heads, "grouped-query")
        svg.text(mid, 24, name, size=15, weight="bold")
        svg.text(mid, 44, f"H_{{kv}} = {g.kv_heads}, g = {group}", size=13, fill=MUTED)
        qw, qgap = 42, 10
        left = mid - (g.heads * qw + (g.heads - 1) * qgap) / 2
        qx = [left + h * (qw + qgap) for h in range(g.heads)]
        kv_w = group * qw + (group - 1) * qgap
        for h, x in enumerate(qx):
            fill, edge = PAIR_COLORS[g.reads[h] % len(PAIR_COLORS)]
            svg.rect(x, 62, qw, 32, fill=fill, stroke=edge, rx=4)
            svg.text(x + qw / 2, 83, f"q_{{{h}}}", size=14, weight="bold")
        for r in range(g.kv_heads):
            members = [h for h in range(g.heads) if g.reads[h] == r]
            kx = qx[members[0]] + (qx[members[-1]] + qw - qx[members[0]] - kv_w) / 2
            fill, edge = PAIR_COLORS[r % len(PAIR_COLORS)]
            svg.rect(kx, 140, kv_w, 44, fill=fill, stroke=edge, width=1.6, rx=4)
            label = f"k_{{{r}}} v_{{{r}}}"
            svg.text(kx + kv_w / 2, 167, label, size=14, weight="bold")
            for h in members:
                svg.line(qx[h] + qw / 2, 94, kx + kv_w / 2, 138, arrow=False,
                         stroke=edge, width=1.6)
        svg.text(mid, 210, f"k_proj, v_proj: {g.kv_proj[1]} \u2192 {g.kv_proj[0]}",
                 size=13.5)
        svg.text(mid, 230, f"cache {fmt(g.cache)}", size=13.5, family=MONO, fill=MUTED)
        svg.text(mid, 251, f"{g.per_token} numbers per token", size=14, weight="bold")
        if p:
            svg.line(x0, 12, x0, 258, arrow=False, stroke=BOX_EDGE, width=1, dash="5 4")
    svg.text(WIDTH / 2, 286, "Each key/value head serves g = H / H_{kv} query heads. "
             "Query head h reads head \u230ah / g\u230b.", size=15, fill=MUTED)
    svg.text(WIDTH / 2, 310, "Numbers are cached per token and per layer.", size=15,
             fill=MUTED)
    return svg


# --- (g) rotary pairs, chapter 16 ----------------------------------------------------------------

@dataclass(frozen=True)
class RotaryPicture:
    """The chapter's one-pair example and the pair layouts of apply_rotary for D = 8."""

    q: tuple[float, float]
    k: tuple[float, float]
    theta: float
    m: int
    n: int
    q_turned: tuple[float, float]
    k_turned: tuple[float, float]
    score: float
    dim: int
    half: tuple[int, ...]          # partner of each feature, interleaved=False
    adjacent: tuple[int, ...]      # partner of each feature, interleaved=True
    thetas: tuple[float, ...]      # theta_i of each pair, as apply_rotary turns it


def rotary_picture(dim: int = 8) -> RotaryPicture:
    """Chapter 16's pair (``torch.manual_seed(2)``, theta 0.3, query at 5, key at 3),
    turned; and which features ``mha_lib.apply_rotary`` pairs, found by rotating each
    unit vector by one position and seeing where it goes."""
    import math

    import mha_lib

    def rotation(angle: float) -> torch.Tensor:
        c, s = math.cos(angle), math.sin(angle)
        return torch.tensor([[c, -s], [s, c]])  # (2, 2)

    torch.manual_seed(2)
    q, k = torch.randn(2), torch.randn(2)
    theta, m, n = 0.3, 5, 3
    q_turned, k_turned = rotation(m * theta) @ q, rotation(n * theta) @ k
    score = float(q_turned @ k_turned)
    for mq, nk in ((2, 0), (m, n), (102, 100), (0, n - m)):  # the chapter's pairs
        other = float((rotation(mq * theta) @ q) @ (rotation(nk * theta) @ k))
        if abs(other - score) > 1e-5:
            raise RuntimeError("the rotated score does not depend on n - m alone")
    partners, thetas = {}, None
    for interleaved in (False, True):
        basis = torch.eye(dim)                                           # (D, D)
        turned = mha_lib.apply_rotary(basis[:, None, :], torch.tensor([1]),
                                      interleaved=interleaved)[:, 0]     # (D, D)
        partner = []
        for j in range(dim):
            moved = [i for i in range(dim) if i != j and abs(float(turned[j, i])) > 1e-7]
            if len(moved) != 1:
                raise RuntimeError(f"feature {j} is paired with {moved}")
            partner.append(moved[0])
        partners[interleaved] = tuple(partner)
        if interleaved:  # theta_i = the angle feature 2i turns by in one position
            thetas = tuple(math.atan2(float(turned[2 * i, 2 * i + 1]),
                                      float(turned[2 * i, 2 * i]))
                           for i in range(dim // 2))
    return RotaryPicture(
        (float(q[0]), float(q[1])), (float(k[0]), float(k[1])), theta, m, n,
        (float(q_turned[0]), float(q_turned[1])), (float(k_turned[0]), float(k_turned[1])),
        score, dim, partners[False], partners[True], thetas)


def _arc(cx: float, cy: float, r: float, start: float, end: float) -> str:
    """An SVG path along a circle from angle ``start`` to ``end`` (radians, the y axis
    pointing up as in the plane of the pair)."""
    import math

    x1, y1 = cx + r * math.cos(start), cy - r * math.sin(start)
    x2, y2 = cx + r * math.cos(end), cy - r * math.sin(end)
    large = 1 if abs(end - start) > math.pi else 0
    sweep = 0 if end > start else 1
    return f"M {x1:.1f} {y1:.1f} A {r:g} {r:g} 0 {large} {sweep} {x2:.1f} {y2:.1f}"


def rope(p: RotaryPicture) -> Svg:
    import math

    half_pairs = sorted({tuple(sorted((j, p.half[j]))) for j in range(p.dim)})
    adj_pairs = sorted({tuple(sorted((j, p.adjacent[j]))) for j in range(p.dim)})
    thetas = ", ".join(f"{t:.3g}" for t in p.thetas)
    desc = (
        "Left: one pair of a query and a key in the plane (the chapter's example, theta "
        f"= {p.theta}). The query q, at position m = {p.m}, turns by m theta = "
        f"{p.m * p.theta:.1f} rad; the key k, at position n = {p.n}, turns by n theta = "
        f"{p.n * p.theta:.1f} rad. Their score, the dot product of the turned vectors, is "
        f"{p.score:.4f}, the same as q . R((n - m) theta) k: it depends on n - m only, and "
        f"the lengths do not change. Right: which features form the pairs in a head of D "
        f"= {p.dim}, as apply_rotary pairs them. Rotate half (interleaved=False, the "
        "library's default; GPT-NeoX and Hugging Face's Llama): pairs "
        + ", ".join(f"({a}, {b})" for a, b in half_pairs) + ". Interleaved "
        "(interleaved=True; the RoFormer paper and Meta's Llama code): pairs "
        + ", ".join(f"({a}, {b})" for a, b in adj_pairs) + f". Pair i turns by theta_i = "
        f"10000^(-2i/D): {thetas} radians per position.")
    svg = Svg(382, "Rotary positions: each pair turns by its position times theta_i; "
              "two layouts of the pairs", desc)
    svg.text(WIDTH / 2, 24, "RoPE turns each pair of a query or key by position \u00d7 "
             "\u03b8_{i}", size=15, weight="bold")
    # Left: the plane of one pair.
    cx, cy, scale = 150, 178, 112
    svg.text(cx, 56, f"one pair, \u03b8 = {p.theta} (the chapter's example)", size=13,
             weight="bold")
    svg.line(cx - 140, cy, cx + 140, cy, arrow=False, stroke=BOX_EDGE, width=1)
    svg.line(cx, cy - 100, cx, cy + 150, arrow=False, stroke=BOX_EDGE, width=1)
    for (vx, vy), (tx, ty), pos, name, color, r in (
            (p.q, p.q_turned, p.m, "q", ACCENT_EDGE, 30),
            (p.k, p.k_turned, p.n, "k", GREEN_EDGE, 84)):
        a0, a1 = math.atan2(vy, vx), math.atan2(ty, tx)
        svg.line(cx, cy, cx + scale * vx, cy - scale * vy, stroke=FADED, width=1.6,
                 dash="4 3")
        svg.line(cx, cy, cx + scale * tx, cy - scale * ty, stroke=color, width=2.4)
        svg.path(_arc(cx, cy, r, a0, a1), stroke=color, width=1.4)
        length = scale * math.hypot(tx, ty)
        lx, ly = cx + (length + 16) * math.cos(a1), cy - (length + 16) * math.sin(a1)
        svg.text(lx, ly + 5, f"{name} at {pos}", size=13, weight="bold", fill=color)
        mid = (a0 + a1) / 2
        svg.text(cx + (r + 8) * math.cos(mid) + 2, cy - (r + 8) * math.sin(mid) + 5,
                 f"{pos}\u03b8", size=13, fill=color, anchor="start", weight="bold")
    svg.line(14, 326, 40, 326, arrow=False, stroke=FADED, width=1.6, dash="4 3")
    svg.text(46, 330, "before turning (position 0)", size=12.5, anchor="start",
             fill=MUTED)
    svg.text(14, 350, "score at (m, n) = (5, 3), (2, 0), (102, 100):", size=12.5,
             anchor="start")
    svg.text(14, 368, f"{p.score:.4f} each time: only n \u2212 m counts".replace("-", "\u2212"),
             size=12.5, anchor="start")
    # Right: the two layouts of D = 8.
    x0, bw, bg = 322, 42, 10
    bx = [x0 + j * (bw + bg) for j in range(p.dim)]
    rows = [
        (84, p.half, "rotate half (interleaved=False, the default):",
         "pair i = (x_{i}, x_{i + D/2}); GPT-NeoX, Hugging Face's Llama"),
        (232, p.adjacent, "interleaved (interleaved=True):",
         "pair i = (x_{2i}, x_{2i+1}); the RoFormer paper, Meta's Llama code"),
    ]
    for y, partner, title, sub in rows:
        svg.text(x0, y - 30, title, size=13, anchor="start", weight="bold")
        svg.text(x0, y - 12, sub, size=12.5, anchor="start", fill=MUTED)
        pair_of = {}
        for j in range(p.dim):
            a, b = sorted((j, partner[j]))
            pair_of[j] = sorted({tuple(sorted((i, partner[i]))) for i in range(p.dim)}
                                ).index((a, b))
        box_y = y + 36
        for j in range(p.dim):
            fill, edge = PAIR_COLORS[pair_of[j] % len(PAIR_COLORS)]
            svg.rect(bx[j], box_y, bw, 32, fill=fill, stroke=edge, width=1.6, rx=4)
            svg.text(bx[j] + bw / 2, box_y + 21, f"x_{{{j}}}", size=13.5, weight="bold")
        for j in range(p.dim):
            if partner[j] < j:
                continue
            a, b = bx[j] + bw / 2, bx[partner[j]] + bw / 2
            _, edge = PAIR_COLORS[pair_of[j] % len(PAIR_COLORS)]
            top = box_y - 6 - 7 * (partner[j] - j - 1) if partner[j] - j > 1 else box_y - 10
            svg.path(f"M {a:g} {box_y:g} C {a:g} {top - 8:g} {b:g} {top - 8:g} {b:g} "
                     f"{box_y:g}", arrow=False, stroke=edge, width=1.6)
        for j in range(p.dim):
            svg.text(bx[j] + bw / 2, box_y + 50, f"i={pair_of[j]}", size=12,
                     fill=PAIR_COLORS[pair_of[j] % len(PAIR_COLORS)][1])
    ly = 352
    svg.text(x0, ly, "pair i turns by \u03b8_{i} = 10000^{\u22122i/D} per position:",
             size=12.5, anchor="start")
    for i, t in enumerate(p.thetas):
        fill, edge = PAIR_COLORS[i % len(PAIR_COLORS)]
        x = x0 + i * 104
        svg.rect(x, ly + 10, 12, 12, fill=fill, stroke=edge, rx=2)
        svg.text(x + 17, ly + 21, f"\u03b8_{{{i}}} = {t:.3g}", size=12.5, anchor="start")
    return svg


# --- (h) the sliding window and the rolling cache, chapter 17 ---------------------------------

@dataclass(frozen=True)
class WindowPicture:
    """The window mask of the running example and what KVCache(window=W) stores."""

    length: int
    window: int
    mask: tuple[tuple[bool, ...], ...]      # sliding_window_mask(L, W)
    causal: tuple[tuple[bool, ...], ...]    # causal_mask(L)
    capacity: int                           # the cache's storage, in positions
    slots: tuple[tuple[int | None, ...], ...]  # each step: the position in each slot
    read: tuple[tuple[int, int], ...]       # each step: the slots the query reads
    kept: tuple[int, ...]                   # positions kept after each step


def window_picture(length: int = 6, window: int = 3) -> WindowPicture:
    """``sliding_window_mask`` and ``causal_mask`` on the running example's length, and a
    ``KVCache(window=W)`` fed one token per call (each key holds its position, so the
    storage can be read back slot by slot); the keys each call returns must be the ones
    the mask's row allows."""
    import mha_lib

    mask = mha_lib.sliding_window_mask(length, window)
    causal = mha_lib.causal_mask(length)
    cache = mha_lib.KVCache(window=window)
    written: set[int] = set()
    slots, reads, kept = [], [], []
    with torch.no_grad():
        for t in range(length):
            key = torch.full((1, 1, 1, 1), float(t))                  # (B, H_kv, 1, D)
            keys, _ = cache.update(key, key)                          # (1, 1, kept + 1, 1)
            allowed = [j for j in range(length) if mask[t, j]]
            if keys.flatten().tolist() != [float(j) for j in allowed]:
                raise RuntimeError(f"step {t}: the cache returned other keys than the mask")
            view = cache.keys[0]                                      # the kept positions
            if keys.untyped_storage().data_ptr() != view.untyped_storage().data_ptr():
                raise RuntimeError("the returned keys are not a view of the storage")
            capacity = cache.allocated_nbytes // (2 * view.element_size())
            start = keys.storage_offset()
            written |= set(range(start, start + keys.size(2)))
            storage = torch.as_strided(view, (capacity,), (1,), 0)    # every slot
            slots.append(tuple(int(storage[i]) if i in written else None
                               for i in range(capacity)))
            reads.append((start, start + keys.size(2)))
            kept.append(cache.kept)
    return WindowPicture(length, window,
                         tuple(tuple(bool(b) for b in r) for r in mask),
                         tuple(tuple(bool(b) for b in r) for r in causal),
                         capacity, tuple(slots), tuple(reads), tuple(kept))


def ring_before(t: int, window: int) -> list[int | None]:
    """The position in each slot of the ring of ``window`` slots before token ``t`` is
    written (position p in slot p mod W; None: empty). tests/test_figures.py asserts
    that chapter 17's rolling_buffer_attention decodes with these keys."""
    return [max((p for p in range(t) if p % window == i), default=None)
            for i in range(window)]


def window_cache(w: WindowPicture) -> Svg:
    W, L = w.window, w.length
    desc = (
        f"Left: the sliding-window mask of the running example, L = {L}, W = {W}: query p "
        f"may attend key j if p - W < j <= p, so each query sees itself and the {W - 1} "
        f"keys before it; the earlier keys have slid out. Right: the ring buffer "
        f"(Mistral's rolling buffer) of W = {W} slots, position t in slot t mod {W}, as "
        "rolling_buffer_attention uses it, one row per decoded token t, level with the "
        "mask's row of query t: the ring before the write, and the new token beside it. "
        f"The token reads the ring's last {W - 1} positions and itself, then overwrites "
        f"the slot that held position t - {W}, which it did not read.")
    svg = Svg(440, f"A sliding window of W = {W} and the ring buffer that serves it", desc)
    svg.text(WIDTH / 2, 26, f"A sliding window, W = {W}, on the running example "
             f"(L = {L}), and its ring", size=16, weight="bold")
    # Left: the mask.
    gx, gy, cell = 110, 100, 36
    svg.text(gx + L * cell / 2, 66, "key j", size=15, fill=MUTED)
    for j in range(L):
        svg.text(gx + (j + 0.5) * cell, 91, str(j), size=15, fill=MUTED)
    svg.text(gx - 12, gy - 9, "query p", size=15, fill=MUTED, anchor="end")
    for p in range(L):
        svg.text(gx - 12, gy + (p + 0.5) * cell + 5, str(p), size=15, fill=MUTED,
                 anchor="end")
        for j in range(L):
            if w.mask[p][j]:
                fill, edge = ACCENT, ACCENT_EDGE
            elif w.causal[p][j]:
                fill, edge = "#e5e7eb", BOX_EDGE
            else:
                fill, edge = "#ffffff", BOX_EDGE
            svg.rect(gx + j * cell, gy + p * cell, cell, cell, fill=fill, stroke=edge,
                     rx=0, width=0.8)
    ly = gy + L * cell + 30
    for k, (fill, edge, label) in enumerate(((ACCENT, ACCENT_EDGE, "in the window"),
                                             ("#e5e7eb", BOX_EDGE, "slid out"),
                                             ("#ffffff", BOX_EDGE, "future"))):
        svg.rect(gx - 60, ly + 24 * k - 13, 15, 15, fill=fill, stroke=edge, rx=2)
        svg.text(gx - 38, ly + 24 * k, label, size=15, anchor="start")
    svg.text(gx - 60, ly + 78, f"attend if p \u2212 {W} < j \u2264 p", size=15,
             anchor="start", weight="bold")
    # Right: the ring buffer as rolling_buffer_attention uses it: each token reads
    # [ring ; itself] first, then overwrites slot t mod W (which held t - W).
    mx, mw = 500, 44
    nx = mx + W * mw + 14  # the new token, beside the ring
    svg.text(mx + (nx + mw - mx) / 2, 66, f"ring of {W} slots: slot = t mod {W}", size=15,
             fill=MUTED)
    for i in range(W):
        svg.text(mx + (i + 0.5) * mw, 91, f"{i}", size=15, fill=MUTED)
    svg.text(nx + mw / 2, 91, "new", size=15, fill=MUTED)
    svg.text(mx - 14, gy - 9, "token t", size=15, fill=MUTED, anchor="end")
    for t in range(L):
        y = gy + t * cell
        svg.text(mx - 14, y + cell / 2 + 5, str(t), size=15, fill=MUTED, anchor="end")
        for i, pos in enumerate(ring_before(t, W)):
            x = mx + i * mw
            if pos is None:
                svg.rect(x + 2, y + 2, mw - 4, cell - 4, fill="#ffffff", stroke=BOX_EDGE,
                         dash="3 2", rx=3)
                continue
            reading = t - pos < W
            svg.rect(x + 2, y + 2, mw - 4, cell - 4, fill=ACCENT if reading else "#f9fafb",
                     stroke=ACCENT_EDGE if reading else BOX_EDGE, rx=3,
                     width=1.6 if reading else 1)
            svg.text(x + mw / 2, y + cell / 2 + 6, str(pos), size=16, family=MONO,
                     fill=INK if reading else FADED)
        svg.rect(nx + 2, y + 2, mw - 4, cell - 4, fill=HOT, stroke=HOT_EDGE, rx=3, width=1.6)
        svg.text(nx + mw / 2, y + cell / 2 + 6, str(t), size=16, family=MONO, weight="bold")
    legend = [(HOT, HOT_EDGE, "new token t"), (ACCENT, ACCENT_EDGE, "read"),
              ("#f9fafb", BOX_EDGE, "held, not read"), ("#ffffff", BOX_EDGE, "empty")]
    for k, (fill, edge, label) in enumerate(legend):
        x, y = mx - 60 + (k % 2) * 150, ly + 24 * (k // 2)
        svg.rect(x, y - 13, 15, 15, fill=fill, stroke=edge, rx=2,
                 dash="3 2" if label == "empty" else None)
        svg.text(x + 22, y, label, size=15, anchor="start")
    svg.text(mx - 60, ly + 54, "reads [ring ; new], then writes", size=15, anchor="start")
    svg.text(mx - 60, ly + 78, f"new over slot t mod {W} (held t \u2212 {W})", size=15,
             anchor="start")
    return svg


@dataclass(frozen=True)
class ChunkPicture:
    """Mistral's rolling buffer fed a prompt in chunks: what each chunk reads, then writes."""

    window: int
    steps: tuple  # per chunk: (held before, chunk positions, mask rows, held after)


def chunk_picture(length: int = 6, window: int = 3, chunk: int = 3) -> ChunkPicture:
    """The bookkeeping of chapter 17's ``rolling_buffer_attention``: each chunk attends to
    [ring ; chunk] under the window mask at the positions the slots hold (-W: empty),
    then writes its last W tokens to slots t mod W. Each chunk's mask must be
    ``sliding_window_mask``'s rows at those positions."""
    import mha_lib

    full = mha_lib.sliding_window_mask(length, window)
    held = [-window] * window
    steps = []
    for s in range(0, length, chunk):
        pos = list(range(s, min(s + chunk, length)))
        keys = held + pos
        rows = tuple(tuple(0 <= p - k < window for k in keys) for p in pos)
        want = tuple(tuple(k >= 0 and bool(full[p, k]) for k in keys) for p in pos)
        if rows != want:
            raise RuntimeError(f"chunk at {s}: the mask is not the window's rows")
        after = list(held)
        for t in pos[-window:]:
            after[t % window] = t
        steps.append((tuple(held), tuple(pos), rows, tuple(after)))
        held = after
    return ChunkPicture(window, tuple(steps))


def chunk_prefill(c: ChunkPicture) -> Svg:
    W = c.window
    desc = (f"The ring of W = {W} slots fed the running example's 6 tokens in two chunks of "
            f"{W}. Each chunk first reads: its queries attend to the keys [ring ; chunk] "
            "under the window mask of the positions the slots hold (empty slots are masked "
            "off). Then it writes its last W tokens into slots t mod W. In the second chunk, "
            "query 3 reads keys 1 and 2 from the ring, which the write of tokens 4 and 5 "
            "then overwrites: written first, they would be lost.")
    svg = Svg(345, "A prompt fed to the ring in two chunks: read, then write", desc)
    svg.text(WIDTH / 2, 26, f"Two chunks of {W} through a ring of W = {W}: read, then write",
             size=16, weight="bold")
    cw, ch = 40, 30
    for k, (held, pos, rows, after) in enumerate(c.steps):
        x0 = 70 + k * 370
        svg.text(x0 + W * cw, 58, f"chunk {k + 1}: tokens {pos[0]} to {pos[-1]}", size=15,
                 weight="bold")
        svg.text(x0 - 8, 82, "1. read", size=15, anchor="end", weight="bold")
        svg.text(x0 + W * cw / 2, 82, "ring", size=15, fill=MUTED)
        svg.text(x0 + W * cw * 1.5, 82, "chunk", size=15, fill=MUTED)
        keys = held + pos
        for j, key in enumerate(keys):  # the keys row, [ring ; chunk]
            x, y = x0 + j * cw, 92
            empty = key < 0
            svg.rect(x + 2, y + 2, cw - 4, ch - 4, fill="#ffffff" if empty else
                     (BOX if j < W else HOT), stroke=HOT_EDGE if j >= W else BOX_EDGE,
                     rx=3, dash="3 2" if empty else None)
            svg.text(x + cw / 2, y + ch / 2 + 6, "\u2013" if empty else str(key), size=15,
                     family=MONO, fill=FADED if empty else INK)
        for i, (p, row) in enumerate(zip(pos, rows)):  # the mask, one row per query
            y = 130 + i * ch
            svg.text(x0 - 8, y + ch / 2 + 5, f"query {p}", size=14, fill=MUTED, anchor="end")
            for j, ok in enumerate(row):
                svg.rect(x0 + j * cw, y, cw, ch, fill=ACCENT if ok else "#ffffff",
                         stroke=ACCENT_EDGE if ok else BOX_EDGE, rx=0, width=0.8)
        y = 130 + len(pos) * ch + 22
        svg.text(x0 - 8, y + ch / 2 + 5, "2. write", size=15, anchor="end", weight="bold")
        for i, key in enumerate(after):  # the ring after the write
            x = x0 + i * cw
            new = key != held[i]
            svg.rect(x + 2, y + 2, cw - 4, ch - 4, fill=HOT if new else BOX,
                     stroke=HOT_EDGE if new else BOX_EDGE, rx=3, width=1.6 if new else 1)
            svg.text(x + cw / 2, y + ch / 2 + 6, str(key), size=15, family=MONO)
        svg.text(x0 + W * cw + 10, y + ch / 2 + 5, f"the ring after: slot t mod {W}", size=14,
                 fill=MUTED, anchor="start")
    ly = 312
    for k, (fill, edge, label) in enumerate(((ACCENT, ACCENT_EDGE, "may attend"),
                                             (HOT, HOT_EDGE, "the chunk's tokens"),
                                             ("#ffffff", BOX_EDGE, "empty slot"))):
        x = 70 + k * 210
        svg.rect(x, ly - 13, 15, 15, fill=fill, stroke=edge, rx=2,
                 dash="3 2" if label == "empty slot" else None)
        svg.text(x + 22, ly, label, size=15, anchor="start")
    return svg


# --- (i) multi-head latent attention, chapter 18 -------------------------------------------------

@dataclass(frozen=True)
class LatentPicture:
    """The chapter's MultiHeadLatentAttention on the running example, as mha_lib runs it."""

    d_model: int
    heads: int
    head_dim: int
    latent: int
    rope: int
    layers: dict                     # layer name -> (in, out) features
    cached_keys: tuple[int, ...]     # the rotary keys the cache holds
    cached_values: tuple[int, ...]   # the latents the cache holds
    per_token: dict                  # design -> numbers cached per token and layer


def latent_picture(d_model: int = 8, heads: int = 4, latent: int = 3,
                   rope: int = 2) -> LatentPicture:
    """Build chapter 18's ``MultiHeadLatentAttention(8, 4, kv_latent_dim=3, rope_dim=2)``,
    check that the absorbed form equals the explicit one and that a cached decode gives
    the causal forward, and count what each design caches per token by decoding the
    running example into a KVCache."""
    import mha_lib

    _, ids, embedded, x, _ = example(d_model, heads)
    tokens = embedded.detach()  # (B, L, d_model): MLA's positions come from its rotary part
    torch.manual_seed(1)
    mla = mha_lib.MultiHeadLatentAttention(d_model, heads, kv_latent_dim=latent,
                                          rope_dim=rope).eval()
    with torch.no_grad():
        out, _ = mla(tokens, is_causal=True)
        absorbed, _ = mla(tokens, is_causal=True, absorb=True)
        torch.testing.assert_close(absorbed, out, atol=1e-6, rtol=0)
        cache = mha_lib.KVCache()
        steps = [mla(tokens[:, t:t + 1], cache=cache, absorb=True)[0]
                 for t in range(tokens.size(1))]
        torch.testing.assert_close(torch.cat(steps, dim=1), out, atol=1e-6, rtol=0)
    B, L = ids.shape
    per_token = {}
    for name, kv in (("multi-head", heads), (f"grouped-query, {heads // 2} kv heads",
                                             heads // 2), ("multi-query", 1)):
        torch.manual_seed(1)
        m = mha_lib.GroupedQueryAttention(d_model, heads, kv).eval()
        other = mha_lib.KVCache()
        with torch.no_grad():
            m(x, cache=other, is_causal=True)
        per_token[name] = other.nbytes // (B * L * 4)
    per_token["latent (MLA)"] = cache.nbytes // (B * L * 4)
    layers = {name: (mod.in_features, mod.out_features) for name, mod in (
        ("q_proj", mla.q_proj), ("q_rope_proj", mla.q_rope_proj),
        ("kv_down", mla.kv_down), ("k_rope_proj", mla.k_rope_proj),
        ("k_up", mla.k_up), ("v_up", mla.v_up), ("out_proj", mla.out_proj))}
    return LatentPicture(d_model, heads, mla.head_dim, latent, rope, layers,
                         tuple(cache.keys[0].shape), tuple(cache.values[0].shape),
                         per_token)


def latent_attention(p: LatentPicture) -> Svg:
    H, D, C, R = p.heads, p.head_dim, p.latent, p.rope
    lay = p.layers
    sizes = "; ".join(f"{k}: {v}" for k, v in p.per_token.items())
    desc = (
        f"Multi-head latent attention on the running example: d_model = {p.d_model}, H = "
        f"{H} heads of D = {D}, a latent of C = {C}, a rotary part of R = {R}. (a) "
        f"Explicit: the token x_t is projected to the content queries q^C ({H} heads of "
        f"{D}, q_proj {lay['q_proj'][0]} to {lay['q_proj'][1]}), the rotary queries q^R "
        f"(q_rope_proj, then rotated at position t), the latent c_t (kv_down, "
        f"{lay['kv_down'][0]} to {C}) and one rotary key k^R_t shared by all heads "
        f"(k_rope_proj, {lay['k_rope_proj'][0]} to {R}, rotated). Only c_t and k^R_t are "
        f"cached: the cache holds the rotary keys {fmt(p.cached_keys)} and the latents "
        f"{fmt(p.cached_values)}. Each head rebuilds its keys k^C = W_UK c (k_up, {C} to "
        f"{lay['k_up'][1]}) and values v = W_UV c (v_up); its score is (q^C . k^C + q^R . "
        f"k^R) / sqrt(D + R); its output is the weighted sum of its values; W_O maps the "
        f"{H} heads back to {p.d_model}. (b) Absorbed: the same scores in another order. "
        f"W_UK moves to the query side, W_UK^T q^C, a latent query of {C} numbers, "
        f"joined by q^R: {C + R} numbers. Every head attends over the cached c and k^R, "
        f"keys [c_j; k^R_j] of {C + R} numbers and values c_j, one key/value head for all "
        f"{H} query heads (multi-query attention of width C + R). The weighted sum of "
        f"latents ({C} numbers per head) goes through W_UV^(h) ({C} to {D}), then W_O. "
        f"Numbers cached per token and layer: {sizes}.")
    svg = Svg(646, "Multi-head latent attention: projections, the absorbed form, and "
              "the cache per token", desc)
    svg.text(WIDTH / 2, 22, f"Multi-head latent attention: d_model = {p.d_model}, "
             f"H = {H}, D = {D}, latent C = {C}, rotary R = {R}", size=15, weight="bold")

    def box(x, y, w, h, lines, fill=BOX, edge=BOX_EDGE):
        """A box with lines (text, weight, size) centred in it."""
        svg.rect(x, y, w, h, fill=fill, stroke=edge, rx=5,
                 width=1.6 if edge != BOX_EDGE else 1.2)
        # sub-labels at 14 units (12.8 px in the column), names as given
        lines = [(t, wt, 14 if wt == "normal" else sz) for t, wt, sz in lines]
        heights = [size + 5 for _, _, size in lines]
        yy = y + (h - sum(heights)) / 2
        for (text, weight, size), step in zip(lines, heights, strict=True):
            yy += step
            svg.text(x + w / 2, yy - 4, text, size=size, weight=weight,
                     fill=INK if weight == "bold" else MUTED)

    # (a) as trained
    svg.text(14, 50, "(a) Explicit: every head's keys and values rebuilt from the "
             "cached latent", size=13.5, weight="bold", anchor="start")
    rows, bh = [64, 112, 160, 208, 256], 38
    box(14, rows[0], 58, rows[-1] + bh - rows[0], [("x_{t}", "bold", 14),
                                                     (f"({p.d_model})", "normal", 13)])
    bx, bw = 94, 120
    proj = [
        (0, "W_{Q}", f"q_proj {lay['q_proj'][0]}\u2192{lay['q_proj'][1]}"),
        (1, "W_{QR}, rope_{t}", f"q_rope_proj {lay['q_rope_proj'][0]}\u2192"
         f"{lay['q_rope_proj'][1]}"),
        (2, "W_{DKV}", f"kv_down {lay['kv_down'][0]}\u2192{lay['kv_down'][1]}"),
        (4, "W_{KR}, rope_{t}", f"k_rope_proj {lay['k_rope_proj'][0]}\u2192"
         f"{lay['k_rope_proj'][1]}"),
    ]
    cx_, cw = 230, 104
    results = {0: ("q^{C}", f"{H} heads of {D}", False),
               1: ("q^{R}", f"{H} heads of {R}", False),
               2: (f"c_{{t}}  ({C})", "cached", True),
               4: (f"k^{{R}}_{{t}}  ({R})", "cached, shared", True)}
    for r, name, note in proj:
        y = rows[r]
        svg.line(72, y + bh / 2, bx - 2, y + bh / 2)
        box(bx, y, bw, bh, [(name, "bold", 13), (note, "normal", 13)])
        svg.line(bx + bw, y + bh / 2, cx_ - 2, y + bh / 2)
        text, note2, cached = results[r]
        box(cx_, y, cw, bh, [(text, "bold", 13), (note2, "normal", 13)],
            fill=GREEN if cached else ACCENT, edge=GREEN_EDGE if cached else ACCENT_EDGE)
    # Up-projections from the latent.
    ux, uw = 356, 100
    kx, kw = 478, 90
    for r, name, note, out in ((2, "W_{UK}", f"k_up {C}\u2192{lay['k_up'][1]}",
                                "k^{C}"),
                               (3, "W_{UV}", f"v_up {C}\u2192{lay['v_up'][1]}",
                                "v")):
        y = rows[r]
        if r == 2:
            svg.line(cx_ + cw, y + bh / 2, ux - 2, y + bh / 2)
        else:
            svg.path(f"M {cx_ + cw + 10:g} {rows[2] + bh / 2:g} V {y + bh / 2:g} "
                     f"H {ux - 2:g}")
        box(ux, y, uw, bh, [(name, "bold", 13), (note, "normal", 13)])
        svg.line(ux + uw, y + bh / 2, kx - 2, y + bh / 2)
        box(kx, y, kw, bh, [(out, "bold", 13), (f"{H} heads of {D}", "normal", 13)],
            fill=ACCENT, edge=ACCENT_EDGE)
    # Attention per head.
    ax, aw = 592, 146
    svg.rect(ax, rows[0], aw, rows[-1] + bh - rows[0], fill=ACCENT, stroke=ACCENT_EDGE,
             width=1.6, rx=5)
    att = [("each head h:", "bold"), ("s = q^{C}\u00b7k^{C} + q^{R}\u00b7k^{R}", "normal"),
           ("over \u221a(D + R)", "normal"), ("o_{h} = \u03a3 softmax(s) v", "normal"),
           (f"y = W_{{O}} [o_{{0}}; \u2026; o_{{{H - 1}}}]", "normal"),
           (f"({p.d_model})", "normal")]
    for k, (text, weight) in enumerate(att):
        svg.text(ax + aw / 2, rows[0] + 38 + 33 * k, text, size=13.5, weight=weight)
    for r in (0, 1):
        svg.line(cx_ + cw, rows[r] + bh / 2, ax - 2, rows[r] + bh / 2)
    for r in (2, 3):
        svg.line(kx + kw, rows[r] + bh / 2, ax - 2, rows[r] + bh / 2)
    svg.line(cx_ + cw, rows[4] + bh / 2, ax - 2, rows[4] + bh / 2)
    # (b) absorbed
    top = 328
    svg.line(12, top - 18, WIDTH - 12, top - 18, arrow=False, stroke=BOX_EDGE, width=1,
             dash="5 4")
    svg.text(14, top + 4, "(b) Absorbed: the same scores, per head h, over the cached c and "
             "k^{R}, no keys rebuilt", size=13.5, weight="bold", anchor="start")
    y, h = top + 22, 66
    steps = [
        (14, 84, [(f"q^{{C}} ({D})", "bold", 13), (f"q^{{R}} ({R})", "bold", 13)],
         ACCENT, ACCENT_EDGE),
        (120, 130, [("W_{UK}^{T} q^{C}", "bold", 13), (f"({C}), joined by q^{{R}}:",
                                                     "normal", 13.5),
                    (f"{C} + {R} = {C + R} numbers", "normal", 13.5)],
         ACCENT, ACCENT_EDGE),
        (272, 150, [("attend", "bold", 13), (f"keys [c_{{j}}; k^{{R}}_{{j}}] ({C + R})",
                                             "normal", 13.5),
                    (f"values c_{{j}} ({C})", "normal", 13.5)], ACCENT, ACCENT_EDGE),
        (444, 118, [("\u03a3_{j} w_{j} c_{j}", "bold", 13), (f"({C} numbers)", "normal",
                                                            13.5)],
         ACCENT, ACCENT_EDGE),
        (584, 154, [("W_{UV}^{(h)}, then W_{O}", "bold", 13),
                    (f"{C} \u2192 {D} per head,", "normal", 13.5),
                    (f"then y ({p.d_model})", "normal", 13.5)],
         ACCENT, ACCENT_EDGE),
    ]
    for k, (x, w, lines, fill, edge) in enumerate(steps):
        box(x, y, w, h, lines, fill=fill, edge=edge)
        if k:
            px = steps[k - 1][0] + steps[k - 1][1]
            svg.line(px, y + h / 2, x - 2, y + h / 2)
    cx0, cy0 = 272, y + h + 24
    box(cx0, cy0, 150, 58, [("the cache", "bold", 13),
                            (f"{fmt(p.cached_values)} c", "normal", 13.5),
                            (f"{fmt(p.cached_keys)} k^{{R}}", "normal", 13.5)],
        fill=GREEN, edge=GREEN_EDGE)
    svg.line(cx0 + 75, cy0, cx0 + 75, y + h + 2)
    svg.text(14, cy0 + 14, f"all {H} query heads read", size=14, anchor="start")
    svg.text(14, cy0 + 31, "one key head: multi-query", size=14, anchor="start")
    svg.text(14, cy0 + 48, "attention of width C + R", size=14, anchor="start")
    svg.text(444, cy0 + 14, "scale 1/\u221a(D + R), as in (a);", size=14,
             anchor="start")
    svg.text(444, cy0 + 31, "the output equals (a)'s", size=14, anchor="start")
    svg.text(444, cy0 + 48, "within 1e-6", size=14, anchor="start")
    # Cache per token.
    base = cy0 + 86
    svg.line(12, base - 20, WIDTH - 12, base - 20, arrow=False, stroke=BOX_EDGE, width=1,
             dash="5 4")
    svg.text(14, base, "Numbers cached per token and layer (running example):",
             size=13.5, weight="bold", anchor="start")
    unit, lx = 14, 300
    for k, (name, n) in enumerate(sorted(p.per_token.items(), key=lambda kv: -kv[1])):
        by = base + 12 + 24 * k
        latent_row = name.startswith("latent")
        svg.text(lx - 10, by + 13, name, size=14, anchor="end",
                 weight="bold" if latent_row else "normal")
        svg.rect(lx, by, n * unit, 17, fill=GREEN if latent_row else BOX,
                 stroke=GREEN_EDGE if latent_row else BOX_EDGE, rx=2)
        what = ("C + R" if latent_row else "2 H D" if name == "multi-head"
                else "2 D" if name == "multi-query" else "2 H_{kv} D")
        svg.text(lx + n * unit + 8, by + 13, f"{n}  ({what})", size=14, anchor="start",
                 weight="bold" if latent_row else "normal")
    # Sub- and superscripts at 12 units (11 px in the column), not the
    # book's floor of MIN_FONT: this figure is dense with them.
    svg.items = [item.replace(f'font-size="{MIN_FONT:g}"', 'font-size="12"')
                 for item in svg.items]
    return svg


# --- writing --------------------------------------------------------------------------------

def figures() -> dict[str, str]:
    """Every figure: file name -> SVG text."""
    s = running_example()
    out = {"pipeline.svg": pipeline(s).render(), "lookup.svg": soft_lookup(lookup()).render(),
           "qkv.svg": qkv(projections()).render(),
           "heads.svg": heads_side_by_side(s).render(),
           "multi_head.svg": multi_head(s).render(),
           "sdpa.svg": sdpa(s).render(),
           "transformer_block.svg": block(s).render(),
           "tiling.svg": tiling(online_softmax()).render(),
           "kv_cache.svg": kv_cache(cache_step()).render(),
           "gqa.svg": gqa([grouping(4), grouping(2), grouping(1)]).render(),
           "rope_pairs.svg": rope(rotary_picture()).render(),
           "window_cache.svg": window_cache(window_picture()).render(),
           "chunk_prefill.svg": chunk_prefill(chunk_picture()).render(),
           "latent.svg": latent_attention(latent_picture()).render()}
    for chapter in CHAPTERS:
        out[f"strip_{chapter:02d}.svg"] = strip(chapter, s).render()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="folder (default: here)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a file in --out differs")
    args = parser.parse_args(argv)
    stale = []
    for name, text in figures().items():
        path = args.out / name
        old = path.read_text(encoding="utf-8") if path.is_file() else ""
        if old == text:
            continue
        stale.append(name)
        if args.check:
            diff = difflib.unified_diff(old.splitlines(), text.splitlines(), name, "new",
                                        lineterm="", n=0)
            print("\n".join(list(diff)[:20]), file=sys.stderr)
        else:
            args.out.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    if args.check and stale:
        print(f"stale figures: {stale}; run book/figures/make_figures.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
