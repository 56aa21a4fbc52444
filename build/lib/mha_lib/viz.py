"""Matplotlib helpers for the notebooks (heat maps of attention weights).

Imported by notebooks only; the rest of ``mha_lib`` does not need
matplotlib.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import torch
from matplotlib.patches import Rectangle

__all__ = ["heatmap", "heatmaps", "attention_explorer", "AttentionExplorer",
           "use_book_style", "BOOK_STYLE", "COLUMN_INCHES", "MIN_FONT_PT"]

# The book's column is 688 px wide at a 1280 px window. A figure at most
# COLUMN_INCHES wide at 100 dpi is shown at its own size, never shrunk, so
# a label of MIN_FONT_PT points is 12.5 px on screen (the browser test
# measures every figure: at least 10 px).
COLUMN_INCHES = 6.88
MIN_FONT_PT = 9
BOOK_STYLE = {
    "figure.dpi": 100, "savefig.dpi": 100,
    "font.size": 10, "axes.titlesize": 10, "axes.labelsize": 10,
    "xtick.labelsize": MIN_FONT_PT, "ytick.labelsize": MIN_FONT_PT,
    "legend.fontsize": MIN_FONT_PT, "legend.title_fontsize": MIN_FONT_PT,
    "figure.titlesize": 11, "figure.figsize": (COLUMN_INCHES, 3.6),
}


def use_book_style() -> None:
    """Matplotlib settings for the book's figures (:data:`BOOK_STYLE`):
    the column's width, labels of at least :data:`MIN_FONT_PT` points."""
    plt.rcParams.update(BOOK_STYLE)


def heatmap(
    weights: torch.Tensor,
    x_labels: Sequence[str] | None = None,
    y_labels: Sequence[str] | None = None,
    title: str | None = None,
    ax=None,
    cmap: str = "viridis",
    vmin: float | None = 0.0,
    vmax: float | None = None,
):
    """Draw a 2-D tensor ``(Lq, Lk)``: rows are queries, columns keys.
    Returns the image.

    Args:
        weights: The tensor to draw, ``(Lq, Lk)``.
        x_labels: One label per key (column), e.g. its token.
        y_labels: One label per query (row).
        title: The title above the map.
        ax: The matplotlib axes to draw on; ``None``: the current one.
        cmap: A matplotlib colour map name.
        vmin, vmax: The values of the colour map's ends; ``None``: the
            tensor's minimum or maximum.
    """
    weights = weights.detach().float().cpu()
    if weights.dim() != 2:
        raise ValueError(f"weights: expected a 2-D tensor (Lq, Lk), "
                         f"got shape {tuple(weights.shape)}")
    ax = ax if ax is not None else plt.gca()
    image = ax.imshow(weights.numpy(), cmap=cmap, vmin=vmin, vmax=vmax)
    if x_labels is not None:
        ax.set_xticks(range(len(x_labels)), x_labels, rotation=60,
                      ha="right")
    if y_labels is not None:
        ax.set_yticks(range(len(y_labels)), y_labels)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    if title:
        ax.set_title(title)
    return image


def heatmaps(
    weights: torch.Tensor,
    x_labels: Sequence[str] | None = None,
    y_labels: Sequence[str] | None = None,
    titles: Sequence[str] | None = None,
    suptitle: str | None = None,
    mask: torch.Tensor | None = None,
):
    """One heat map per head of ``(H, Lq, Lk)`` weights, in the column's
    width: side by side for up to 3 heads, else two per row. Returns the
    figure.

    Args:
        weights: Attention weights of one sequence, ``(H, Lq, Lk)``; drawn
            on a scale from 0 to 1.
        x_labels: One label per key, shown under the bottom row.
        y_labels: One label per query, shown left of the first column.
        titles: One title per head; ``None``: ``"head 0"``, ``"head 1"``...
        suptitle: The title above all the maps.
        mask: A bool ``(Lq, Lk)`` mask, True = may attend (chapter 7);
            the cells it hides are hatched in every map, to tell a
            masked 0 from a small weight.
    """
    weights = weights.detach()
    if weights.dim() != 3:
        raise ValueError(f"weights: expected a 3-D tensor (H, Lq, Lk), "
                         f"got shape {tuple(weights.shape)}")
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError(f"mask: expected a bool tensor (True = may "
                        f"attend), got {mask.dtype}")
    if mask is not None and mask.shape != weights.shape[1:]:
        raise ValueError(f"mask: expected shape (Lq, Lk) = "
                         f"{tuple(weights.shape[1:])}, got "
                         f"{tuple(mask.shape)}")
    hidden = [] if mask is None else (~mask).nonzero().tolist()
    num = weights.size(0)
    cols = num if num <= 3 else 2
    rows = -(-num // cols)
    width = COLUMN_INCHES - 0.15  # room for the tight bounding box
    # each row as tall as its maps: Lq / Lk of a panel's width, and labels
    aspect = weights.size(1) / weights.size(2)
    height = min(width / cols * aspect + 0.8, 3.4) * rows
    fig, axes = plt.subplots(rows, cols, figsize=(width, height),
                             squeeze=False, layout="constrained")
    flat = axes.ravel().tolist()
    for h, ax in enumerate(flat[:num]):
        image = heatmap(weights[h], x_labels,
                        y_labels if h % cols == 0 else None,
                        titles[h] if titles else f"head {h}",
                        ax=ax, vmax=1.0)
        for i, j in hidden:  # (query, key)
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False,
                                   hatch="//", edgecolor="0.7", lw=0))
        if h % cols:
            ax.set_ylabel("")
            ax.set_yticks([])
        if h < num - cols:  # keys are labelled on the bottom row only
            ax.set_xlabel("")
            ax.set_xticks([])
    for ax in flat[num:]:
        ax.set_axis_off()
    fig.colorbar(image, ax=flat, shrink=0.8)
    if suptitle:
        fig.suptitle(suptitle)
    return fig


# --- the attention explorer (chapter 15) ----------------------------------

_EXPLORER_CSS = """
.attention-explorer{font:14px/1.4 system-ui,sans-serif;margin:.5em 0;
 max-width:100%;box-sizing:border-box}
.attention-explorer .ae-controls{display:flex;flex-wrap:wrap;gap:.4em 1em;
 align-items:center;margin-bottom:.4em}
.attention-explorer .ae-controls select{font:inherit}
.attention-explorer .ae-row{margin:.1em 0 .4em}
.attention-explorer .ae-label{font-size:12px;opacity:.75}
.attention-explorer .ae-tok:hover{border-color:#e8590c}
.attention-explorer .ae-tok:focus{outline:2px solid #e8590c;
 outline-offset:1px}
.attention-explorer .ae-tok.ae-active{border-color:#e8590c;
 box-shadow:0 0 0 2px #e8590c inset}
.attention-explorer .ae-status{font-size:13px;min-height:1.4em}
"""

_CHIP_STYLE = ("display:inline-block;vertical-align:top;min-width:1.9em;"
               "margin:0 3px 3px 0;padding:1px 3px;border-radius:3px;"
               "border:1px solid rgba(127,127,127,.45);text-align:center;"
               "font-family:ui-monospace,monospace;white-space:pre;"
               "cursor:pointer")
_WEIGHT_STYLE = "display:block;font-size:10px;min-height:1.2em"

# Vanilla JavaScript, no library: it finds its own root (the element
# around the script), reads the weights from the JSON next to it and
# colours the tokens. The server-rendered HTML already shows the first
# view, so an untrusted notebook (scripts off) still shows something true.
_EXPLORER_JS = r"""
(function(){
var s=document.currentScript,root=s&&s.closest('.attention-explorer');
if(!root)return;
if(root.getAttribute('data-ready'))return;
root.setAttribute('data-ready','1');
var D=JSON.parse(root.querySelector('.ae-data').textContent);
var L=root.querySelector('.ae-layer'),H=root.querySelector('.ae-head');
var Q=root.querySelectorAll('.ae-q .ae-tok');
var K=root.querySelectorAll('.ae-k .ae-tok');
var st=root.querySelector('.ae-status');
var cur={side:'q',i:D.tokens.length-1};
function w(l,h,i,j){return D.weights[l][h][i][j]/D.scale;}
function paint(chips,get,n){
 for(var j=0;j<chips.length;j++){
  var x=get(j),c=chips[j];
  c.setAttribute('data-weight',x.toFixed(D.digits));
  c.style.background=x>0?'rgba('+D.rgb+','+x.toFixed(3)+')':'';
  c.style.color=x>0.55?'#fff':'';
  c.querySelector('.ae-w').textContent=
   x>=0.005?x.toFixed(2).replace(/^0/,''):'';
 }}
function clear(chips){for(var j=0;j<chips.length;j++){var c=chips[j];
 c.removeAttribute('data-weight');c.style.background='';c.style.color='';
 c.style.outline='';
 c.classList.remove('ae-active');c.querySelector('.ae-w').textContent='';}}
function show(){
 var l=+L.value,h=+H.value,i=cur.i;clear(Q);clear(K);
 var on=cur.side==='q'?Q[i]:K[i];on.classList.add('ae-active');
 on.style.outline='2px solid #e8590c';
 if(cur.side==='q'){
  paint(K,function(j){return w(l,h,i,j);});}
 else{
  paint(Q,function(j){return w(l,h,j,i);});}
 var what=cur.side==='q'?'query':'key';
 var chips=cur.side==='q'?K:Q,best=[];
 for(var j=0;j<chips.length;j++)
  best.push([+chips[j].getAttribute('data-weight'),j]);
 best.sort(function(a,b){return b[0]-a[0]||a[1]-b[1];});
 var top=best.slice(0,3).filter(function(b){return b[0]>0;})
  .map(function(b){
   return '"'+D.tokens[b[1]]+'" ('+b[1]+') '+b[0].toFixed(2);});
 st.textContent=D.layers[l]+', head '+h+': '+what+' "'+D.tokens[i]
  +'" ('+i+') '+(cur.side==='q'?'attends to ':'is attended by ')
  +(top.length?top.join(', '):'nothing');
}
function bind(chips,side){
 for(var i=0;i<chips.length;i++)(function(i){
  function go(){cur={side:side,i:i};show();}
  chips[i].addEventListener('mouseenter',go);
  chips[i].addEventListener('focus',go);
 })(i);}
bind(Q,'q');bind(K,'k');
L.addEventListener('change',show);H.addEventListener('change',show);
show();
})();
"""


class AttentionExplorer:
    """Attention weights as an interactive, self-contained HTML view
    (made by :func:`attention_explorer`; chapter 15).

    In a notebook it displays itself (``_repr_html_``); :meth:`save`
    writes it as a page of its own. The HTML holds its data, its style
    and a short script: no CDN, no require.js, no running kernel. Without
    scripts (an untrusted notebook) it shows its first view unchanged.

    Args:
        html: The view's HTML, one ``<div class="attention-explorer">``.
        summary: What ``repr`` shows (a notebook's plain-text output).
    """

    def __init__(self, html: str, summary: str):
        self.html = html
        self._summary = summary

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        return self._summary

    def save(self, path) -> None:
        """Write a standalone HTML page.

        Args:
            path: File name of the page (``str`` or ``pathlib.Path``).
        """
        from pathlib import Path
        Path(path).write_text(
            "<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
            "<title>attention explorer</title></head><body>\n"
            + self.html + "\n</body></html>\n", encoding="utf-8")


MAX_WEIGHTS = 1_000_000
"""The most weights (``N * H * L * L``) :func:`attention_explorer` stores
by default, e.g. 1 layer of 4 heads over 500 tokens: 2.5 MB of HTML for
causal weights with 3 digits (5 MB with 6 digits, no zeros), about as
much as a notebook output or a book page should carry."""


def _json_for_html(text: str) -> str:
    """JSON text safe inside a ``<script>`` element: ``<``, ``>`` and ``&``
    as ``\\u`` escapes (so no ``</script>``, ``<!--`` or ``<script`` can
    reach the HTML parser), and U+2028/U+2029 too (line ends to older
    JavaScript). ``JSON.parse`` reads the same data back."""
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"),
                         ("&", "\\u0026"), ("\u2028", "\\u2028"),
                         ("\u2029", "\\u2029")):
        text = text.replace(char, escape)
    return text


def attention_explorer(
    weights: torch.Tensor,
    tokens: Sequence[str],
    layer_names: Sequence[str] | None = None,
    title: str | None = None,
    digits: int = 3,
    max_weights: int = MAX_WEIGHTS,
) -> AttentionExplorer:
    """An interactive view of self-attention weights: the tokens twice,
    as queries and as keys, with a layer and a head selector. Pointing at
    (or keyboard-focusing) a query colours the keys by the weight it gives
    them; pointing at a key colours the queries by the weight they give
    it. The root element has the class ``attention-explorer``. Chapter 15.

    Args:
        weights: ``(N, H, L, L)`` (layers, heads, queries, keys),
            ``(H, L, L)`` or ``(L, L)``; each row a distribution over
            keys, as ``model(idx, need_weights=True)`` returns for one
            sequence.
        tokens: The ``L`` token strings, one per position.
        layer_names: One name per layer; None for "layer 1", "layer 2"...
        title: A line above the view; None for none.
        digits: Decimal digits of the weights stored in the page (and
            read back in its ``data-weight`` attributes), 1 to 6.
        max_weights: The most weights ``N * H * L * L`` to store; more
            are refused (the page grows with them, quadratically in
            ``L``): pass fewer layers, heads or tokens, or raise it.
            Default ``mha_lib.viz.MAX_WEIGHTS``, 1,000,000.
    """
    import html as html_lib
    import json
    import zlib

    if not isinstance(weights, torch.Tensor):
        raise TypeError(f"weights: expected a torch.Tensor (N, H, L, L), "
                        f"got {type(weights).__name__}")
    w = weights.detach().float().cpu()
    while w.dim() < 4:
        w = w.unsqueeze(0)  # (N, H, L, L)
    if (weights.dim() not in (2, 3, 4) or w.size(-1) != w.size(-2)
            or w.size(-1) == 0):
        raise ValueError(f"weights: expected shape (N, H, L, L), (H, L, L) "
                         f"or (L, L) with L > 0, got "
                         f"{tuple(weights.shape)}")
    if not torch.isfinite(w).all() or (w < 0).any():
        raise ValueError(f"weights: expected finite, non-negative weights, "
                         f"got values from {w.min().item()} to "
                         f"{w.max().item()}")
    num_layers, num_heads, length = w.size(0), w.size(1), w.size(-1)
    if isinstance(max_weights, bool) or not isinstance(max_weights, int) \
            or max_weights < 1:
        raise ValueError(f"max_weights: expected a positive int, "
                         f"got {max_weights!r}")
    if w.numel() > max_weights:
        raise ValueError(
            f"weights: expected at most max_weights={max_weights:,} "
            f"weights (N * H * L * L; the page stores each), got "
            f"{num_layers} x {num_heads} x {length} x {length} = "
            f"{w.numel():,}: pass fewer layers, heads or tokens (e.g. "
            f"weights[:, :, -64:, -64:]), or raise max_weights")
    if isinstance(tokens, str) or len(tokens) != length:
        raise ValueError(f"tokens: expected a sequence of {length} strings "
                         f"(one per position), got {tokens!r}")
    tokens = [str(t) for t in tokens]
    if layer_names is None:
        layer_names = [f"layer {i + 1}" for i in range(num_layers)]
    layer_names = [str(n) for n in layer_names]
    if len(layer_names) != num_layers:
        raise ValueError(f"layer_names: expected {num_layers} names, got "
                         f"{len(layer_names)}: {layer_names!r}")
    if isinstance(digits, bool) or not isinstance(digits, int) \
            or not 1 <= digits <= 6:
        raise ValueError(f"digits: expected an int from 1 to 6, "
                         f"got {digits!r}")
    scale = 10 ** digits
    stored = (w * scale).round().to(torch.int64)  # (N, H, L, L)
    data = {"tokens": tokens, "layers": layer_names, "scale": scale,
            "digits": digits, "rgb": "31,119,180",
            "weights": stored.tolist()}
    payload = json.dumps(data, separators=(",", ":"))
    # Deterministic id: the same weights give the same HTML (nbval).
    uid = f"ae-{zlib.crc32(payload.encode()):08x}"
    esc = html_lib.escape

    # The first view, drawn here so that it shows without scripts too:
    # layer 1, head 0, the last token as the query. The tokens' layout is
    # in style attributes, which an untrusted notebook keeps (it drops
    # <style> and <script>).
    first = (stored[0, 0, -1] / scale).tolist()  # (L,)

    def chips(side: str) -> str:
        out = []
        for i, t in enumerate(tokens):
            cls, attrs, style, label = "ae-tok", "", _CHIP_STYLE, ""
            if side == "q" and i == length - 1:
                cls += " ae-active"
                style += ";outline:2px solid #e8590c"
            if side == "k" and first[i] > 0:
                if first[i] >= 0.005:  # as the script shows them
                    label = f"{first[i]:.2f}".lstrip("0")
                attrs = f' data-weight="{first[i]:.{digits}f}"'
                style += f";background:rgba(31,119,180,{first[i]:.3f})"
            out.append(
                f'<span class="{cls}"{attrs} style="{style}" tabindex="0" '
                f'role="button" data-side="{side}" data-pos="{i}" '
                f'title="position {i}">{esc(t)}'
                f'<span class="ae-w" style="{_WEIGHT_STYLE}">{label}'
                f"</span></span>")
        return "".join(out)

    def options(names: Sequence[str]) -> str:
        return "".join(f'<option value="{i}">{esc(n)}</option>'
                       for i, n in enumerate(names))

    head_names = [f"head {h}" for h in range(num_heads)]
    safe_payload = _json_for_html(payload)
    parts = [
        f'<div class="attention-explorer" id="{uid}">',
        f"<style>{_EXPLORER_CSS}</style>",
        f'<div class="ae-title"><b>{esc(title)}</b></div>' if title else "",
        '<div class="ae-controls">'
        f'<label>layer <select class="ae-layer">{options(layer_names)}'
        "</select></label>"
        f'<label>head <select class="ae-head">{options(head_names)}'
        "</select></label>"
        '<span class="ae-label">point at or tab to a token</span></div>',
        '<div class="ae-label">queries: what does this token look at?'
        "</div>",
        f'<div class="ae-row ae-q">{chips("q")}</div>',
        '<div class="ae-label">keys: which tokens look at this one?</div>',
        f'<div class="ae-row ae-k">{chips("k")}</div>',
        '<div class="ae-status" aria-live="polite">(the explorer needs '
        "JavaScript: in Jupyter, trust the notebook)</div>",
        f'<script type="application/json" class="ae-data">{safe_payload}'
        "</script>",
        f"<script>{_EXPLORER_JS}</script>",
        "</div>",
    ]
    summary = (f"AttentionExplorer({num_layers} layers x {num_heads} "
               f"heads, {length} tokens)")
    return AttentionExplorer("".join(parts), summary)
