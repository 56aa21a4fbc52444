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


def running_example(d_model: int = 8, num_heads: int = 4) -> Shapes:
    """Run the book's running example through mha_lib, stage by stage, and record the
    shapes; the full module must agree with the stages."""
    import mha_lib
    from mha_lib.exercises import SENTENCES

    torch.manual_seed(0)
    stoi = mha_lib.build_vocab(SENTENCES)
    ids, _ = mha_lib.encode(SENTENCES, stoi)                          # (B, L)
    embedded = nn.Embedding(len(stoi), d_model)(ids)                  # (B, L, d_model)
    x = mha_lib.PositionalEncoding(d_model, dropout=0.0)(embedded)    # (B, L, d_model)
    mha = mha_lib.MultiHeadAttention(d_model, num_heads).eval()
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
        head = ' marker-end="url(#arrow)"' if arrow else ""
        self.items.append(
            f'<line x1="{x1:g}" y1="{y1:g}" x2="{x2:g}" y2="{y2:g}" stroke="{stroke}" '
            f'stroke-width="{width:g}"{extra}{head}/>')

    def path(self, d: str, arrow: bool = True, stroke: str = INK, width: float = 1.4) -> None:
        head = ' marker-end="url(#arrow)"' if arrow else ""
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
            f'<path d="M 0 0 L 10 5 L 0 10 z" fill="{INK}"/></marker></defs>\n'
            f'<rect x="0" y="0" width="{WIDTH}" height="{self.height}" fill="#ffffff"/>\n'
        )
        return head + "\n".join(self.items) + "\n</svg>\n"


def _scripts(content: str, size: float) -> str:
    """Escape ``content`` and turn ``^{x}`` / ``_{x}`` into shifted, smaller tspans."""
    out, i, small = [], 0, f"{size * 0.72:g}"
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
    stages_1 = [
        ("text", "3 sentences", None),
        ("token ids", "tokenize, vocab", s.ids),
        ("embedding", f"nn.Embedding({s.vocab}, {s.d_model})", s.embedded),
        ("+ positions", "sinusoidal table", s.positioned),
        ("Q, K, V", "three projections", s.q),
    ]
    stages_2 = [
        ("split heads", f"H = {s.heads}, D = {s.head_dim}", s.q_heads),
        ("attention", "softmax(QK^{T}/\u221aD) V", s.head_out),
        ("merge heads", "concatenate", s.merged),
        ("W^{O}", "out_proj", s.output),
        ("output", "one vector per token", s.output),
    ]
    desc = (
        "The running example through multi-head attention, in two rows. Row 1: text "
        f"(3 sentences) becomes token ids of shape {fmt(s.ids)}, embeddings of shape "
        f"{fmt(s.embedded)}, plus positional encodings {fmt(s.positioned)}, then three "
        f"projections Q, K and V, each {fmt(s.q)}. Row 2: each is split into {s.heads} "
        f"heads, {fmt(s.q_heads)}; attention per head gives weights {fmt(s.weights)} and "
        f"outputs {fmt(s.head_out)}; the heads are merged back to {fmt(s.merged)}; the "
        f"output projection W^O gives the output {fmt(s.output)}, one vector per token.")
    svg = Svg(330, "Multi-head attention on the running example, with shapes", desc)
    svg.text(WIDTH / 2, 24, f"The running example: B = {s.batch} sentences, "
             f"L = {s.length} tokens, d_model = {s.d_model}, H = {s.heads} heads",
             size=15, weight="bold")
    box_w, box_h, step, x0 = 122, 54, 150, 14
    for row, (stages, y) in enumerate(((stages_1, 50), (stages_2, 200))):
        for i, (name, note, shape) in enumerate(stages):
            x = x0 + i * step
            hot = name == "attention"
            svg.rect(x, y, box_w, box_h, fill=ACCENT if hot else BOX,
                     stroke=ACCENT_EDGE if hot else BOX_EDGE)
            svg.text(x + box_w / 2, y + 23, name, size=15, weight="bold")
            svg.text(x + box_w / 2, y + 42, note, size=12, fill=MUTED)
            if shape is not None:
                svg.text(x + box_w / 2, y + box_h + 19, fmt(shape), size=13, family=MONO,
                         fill=MUTED)
            if i:
                svg.line(x - step + box_w + 2, y + box_h / 2, x - 2, y + box_h / 2)
        if row == 0:
            # Q, K, V go on to row 2: down, back to the left, down into "split heads".
            xe = x0 + 4 * step + box_w / 2
            svg.path(f"M {xe:g} {y + box_h + 26:g} V 170 H {x0 + box_w / 2:g} V 196")
    # The attention weights leave the attention box as a second output.
    xa = x0 + step + box_w / 2
    svg.line(xa, 200 + box_h + 26, xa, 300, dash="4 3")
    svg.text(xa + 8, 316, f"weights {fmt(s.weights)}: one L \u00d7 L map per sentence "
             "and head", size=13, anchor="start", family=SANS, fill=ACCENT_EDGE)
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


def _strip_shapes(s: Shapes) -> dict[str, tuple[int, ...] | None]:
    return {"text": None, "ids": s.ids, "embed": s.embedded, "+ pos": s.positioned,
            "Q K V": s.q, "heads": s.q_heads, "attention": s.head_out, "merge": s.merged,
            "W^{O}": s.output}


def _plain(stage: str) -> str:
    return stage.replace("^{O}", "^O").replace("+ pos", "+ positions").replace(
        "embed", "embeddings").replace("heads", "split heads")


def strip_alt(chapter: int, s: Shapes | None = None) -> str:
    """The alt text of chapter ``chapter``'s strip: where the chapter sits in the pipeline."""
    s = s or running_example()
    hot, caption, module = CHAPTERS[chapter]
    shapes = _strip_shapes(s)
    stages = ", ".join(_plain(st) + (f" {fmt(shapes[st])}" if shapes[st] else "")
                       for st in STRIP_STAGES)
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
    shapes = _strip_shapes(s)
    svg = Svg(118 if module else 96, f"You are here: {caption.replace('^{O}', '^O')}",
              strip_alt(chapter, s))
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
                     size=11.5, family=MONO, fill=HOT_EDGE if on else MUTED)
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
    svg.rect(cx - 250, 68, 500, 40, fill=GREEN, stroke=GREEN_EDGE)
    svg.text(cx, 87, "Q = XW^{Q},   K = XW^{K},   V = XW^{V}", size=15, weight="bold")
    svg.text(cx, 103, f"each {fmt(s.q)}; head i takes its own {d} of the {s.d_model} columns",
             size=12, fill=MUTED)
    col_w, gap = 160, (WIDTH - 4 * 160) / 5
    for i in range(h):
        x = gap + i * (col_w + gap)
        mid = x + col_w / 2
        svg.line(mid, 108, mid, 132)
        svg.rect(x, 134, col_w, 44, fill=BOX)
        svg.text(mid, 153, f"Q_{{{i + 1}}}, K_{{{i + 1}}}, V_{{{i + 1}}}", size=14,
                 weight="bold")
        svg.text(mid, 171, fmt((s.batch, s.length, d)), size=12, family=MONO, fill=MUTED)
        svg.line(mid, 178, mid, 200)
        svg.rect(x, 202, col_w, 70, fill=ACCENT, stroke=ACCENT_EDGE)
        svg.text(mid, 222, f"head {i + 1}: attention", size=14, weight="bold")
        svg.text(mid, 241, "softmax(QK^{T}/\u221aD) V", size=12.5)
        svg.text(mid, 262, f"weights {fmt((s.batch, s.length, s.length))}", size=11.5,
                 family=MONO, fill=ACCENT_EDGE)
        svg.line(mid, 272, mid, 294)
        svg.text(mid, 310, f"out {fmt((s.batch, s.length, d))}", size=12, family=MONO,
                 fill=MUTED)
        svg.line(mid, 316, mid, 336)
    svg.rect(gap, 338, WIDTH - 2 * gap, 34, fill=BOX)
    svg.text(cx, 360, f"concatenate the {h} heads (merge_heads): {fmt(s.merged)}", size=14)
    svg.line(cx, 372, cx, 390)
    svg.rect(cx - 170, 392, 340, 52, fill=GREEN, stroke=GREEN_EDGE)
    svg.text(cx, 414, "W^{O}  (out_proj)", size=15, weight="bold")
    svg.text(cx, 434, f"output {fmt(s.output)}", size=13, family=MONO)
    return svg


# --- (d) the transformer block, chapter 12 -----------------------------------------------------

def block(s: Shapes) -> Svg:
    x_shape, hid = fmt(s.output), fmt(s.ffn_hidden)
    desc = (
        "Two transformer blocks side by side, both mapping x of shape "
        f"{x_shape} to an output of the same shape. Left, pre-norm: x goes through "
        "LayerNorm, then multi-head attention, and is added back to x (a residual "
        "connection); that sum goes through LayerNorm, then the feed-forward network, whose "
        "output is added to that sum. Right, post-norm (the original transformer): x goes "
        "through multi-head attention, is added to x, then LayerNorm; then the "
        "feed-forward network, added to its input, then LayerNorm. The feed-forward "
        f"network is Linear {s.d_model} to {s.d_ff}, an activation, Linear {s.d_ff} to "
        f"{s.d_model}; its hidden shape is {hid}.")
    svg = Svg(490, "The transformer block: pre-norm and post-norm", desc)
    ffn_lines = (f"FFN: Linear {s.d_model}\u2192{s.d_ff}", f"activation on {hid}",
                 f"Linear {s.d_ff}\u2192{s.d_model}")

    def column(x: float, title: str, order: list[str]) -> None:
        mid, w = x + 150, 190
        svg.text(mid, 24, title, size=15, weight="bold")
        svg.text(mid, 52, f"x  {x_shape}", size=14, family=MONO)
        y = 58
        branch = y
        for step in order:
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
            if step == "LN":
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
        svg.line(mid, y, mid, y + 20)
        svg.text(mid, y + 36, f"output  {x_shape}", size=14, family=MONO)

    column(45, "pre-norm (GPT-2, Llama)",
           ["branch", "LN", "MHA", "+", "branch", "LN", "FFN", "+"])
    column(405, "post-norm (the 2017 transformer)",
           ["branch", "MHA", "+", "LN", "branch", "FFN", "+", "LN"])
    svg.line(375, 12, 375, 478, arrow=False, stroke=BOX_EDGE, width=1, dash="5 4")
    return svg


# --- writing --------------------------------------------------------------------------------

def figures() -> dict[str, str]:
    """Every figure: file name -> SVG text."""
    s = running_example()
    out = {"pipeline.svg": pipeline(s).render(), "multi_head.svg": multi_head(s).render(),
           "transformer_block.svg": block(s).render()}
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
