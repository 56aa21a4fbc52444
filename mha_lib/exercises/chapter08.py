"""Checkers for chapter 8's exercises (concatenating heads, the full
module, its forward from four layers)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from mha_lib.exercises.verdict import (
    Verdict,
    attempt,
    catalogue,
    check_calls,
    check_tensor,
    passed,
)
from mha_lib.heads import merge_heads
from mha_lib.masks import causal_mask, padding_mask
from mha_lib.mha import MultiHeadAttention

__all__ = [  # in the order of the exercises (the API page lists them so)
    "check_concat_heads",
    "check_masked_self_attention",
    "check_num_parameters",
    "check_mha_forward",
]

_CONCAT = "Concatenating the heads"
_MASKS = "Masks go straight through"

CONCAT = catalogue(
    "check_concat_heads", 8,
    wrong_axis=("the heads are concatenated along the wrong axis: they go "
                "side by side in the features, dim=-1", _CONCAT),
    interleaved=("the heads are interleaved feature by feature (stacked "
                 "on a last axis, then flattened); head h fills the block "
                 "of features [h*D, (h+1)*D)", _CONCAT),
    reversed=("the heads come in reverse order: head 0 first", _CONCAT),
    stacked=("the heads are stacked on a new axis but not joined: the "
             "result is (B, L, H*D), the heads side by side in the "
             "features; torch.cat(heads, dim=-1), or flatten the head "
             "and feature axes of stack(heads, dim=-2)", _CONCAT),
    no_transpose=("the heads are stacked as (B, H, L, D) and reshaped "
                  "without moving H next to D: reshape then mixes "
                  "positions and heads; transpose to (B, L, H, D) first",
                  _CONCAT),
    head_axis=("the heads are stacked as (B, H, L, D) and L and D are "
               "flattened: that fuses positions with features; the head "
               "axis must sit next to D, so stack on dim=-2 (or "
               "transpose to (B, L, H, D)) before flattening", _CONCAT),
    stack_first=("the heads are stacked on a new first axis, (H, B, L, "
                 "D), and reshaped to (B, L, H*D): reshape reads the "
                 "numbers in memory order, head by head, so it mixes "
                 "sentences, positions and heads; stack on dim=-2, "
                 "(B, L, H, D), then flatten the last two axes",
                 _CONCAT),
    view=("view cannot fuse the axes of a transposed tensor, which is "
          "not contiguous in memory: use reshape, or "
          ".contiguous().view(...)", _CONCAT),
)


def _explain_concat(error: BaseException, record: object) -> object:
    """``view`` after a transpose: the tensor is not contiguous."""
    return CONCAT["view"] if (isinstance(error, RuntimeError)
                              and "view" in str(error)) else None


def check_concat_heads(
    fn: Callable[[list[torch.Tensor]], torch.Tensor],
) -> Verdict:
    """Exercise 8.1: ``fn(heads)`` takes a list of ``H`` per-head outputs,
    each ``(B, L, D)``, and concatenates them into ``(B, L, H*D)`` like
    :func:`~mha_lib.merge_heads`. Any correct form passes (``torch.cat``
    on the last axis, ``stack(..., dim=-2).flatten(-2)``, ...); only the
    values are judged."""
    generator = torch.Generator().manual_seed(8)
    for batch, heads, length, head_dim in ((3, 4, 6, 2), (2, 3, 5, 4),
                                           (1, 1, 2, 3)):
        x = torch.randn(batch, heads, length, head_dim,
                        generator=generator)  # (B, H, L, D)
        per_head = list(x.unbind(dim=1))  # H x (B, L, D), strided views
        call = attempt(fn, per_head, shown=f"{heads} heads of shape "
                                           f"{(batch, length, head_dim)}",
                       explain=_explain_concat)
        if call.verdict is not None:
            return call.verdict
        problem = check_tensor(
            call.label, call.value, merge_heads(x), axes="(B, L, H*D)",
            atol=0.0, rtol=0.0, mistakes=[
                (CONCAT["wrong_axis"], torch.cat(per_head, dim=0)),
                (CONCAT["wrong_axis"], torch.cat(per_head, dim=1)),
                (CONCAT["interleaved"],
                 torch.stack(per_head, dim=-1).flatten(-2)),
                (CONCAT["reversed"], torch.cat(per_head[::-1], dim=-1)),
                *[(CONCAT["stacked"], torch.stack(per_head, dim=d))
                  for d in range(4)],
                (CONCAT["no_transpose"],
                 torch.stack(per_head, dim=1).reshape(batch, length, -1)),
                (CONCAT["head_axis"],
                 torch.stack(per_head, dim=1).flatten(2)),
                (CONCAT["stack_first"],
                 torch.stack(per_head).reshape(batch, length, -1)),
            ])
        if problem is not None:
            return problem
    return Verdict(
        True, "head h fills features [h*D, (h+1)*D), as in merge_heads")


MASKED = catalogue(
    "check_masked_self_attention", 8,
    padding_only=("this is the padding mask alone: tokens still see "
                  "their future; combine it with the causal mask by &",
                  _MASKS),
    causal_only=("this is the causal mask alone: the pads still attend "
                 "to pads; combine it with the padding mask by &", _MASKS),
    either=("the masks are combined with |: a key must be real AND in "
            "the past, &", _MASKS),
    inverted=("the mask is inverted: in this book True means \"may "
              "attend\" (nn.MultiheadAttention's convention is the "
              "opposite)", _MASKS),
    no_mask=("that is the output without any mask: every token still "
             "sees pads and its future; pass mask=padding_mask(lengths) "
             "& causal_mask(L)", _MASKS),
    future=("the causal part is the upper triangle: each token sees "
            "itself and its future instead of its past; causal_mask(L) "
            "is the lower triangle, key j <= query i", _MASKS),
    off_by_one=("the causal part is tril(-1), strictly below the "
                "diagonal: a token must also see itself; causal_mask(L) "
                "keeps the diagonal, key j <= query i", _MASKS),
    query_axis=("the pads' own rows are masked (a padding mask on the "
                "query axis, (B, 1, L, 1)), so the pads attend nothing; "
                "only the pad keys are to be hidden: padding_mask(lengths)"
                ", (B, 1, 1, L), & causal_mask(L), and a pad query still "
                "attends the real tokens before it", _MASKS),
    pair=("output is the pair (output, weights) the module returns: "
          "take [0]", "Assembling the module"),
)


def check_masked_self_attention(
    mha: MultiHeadAttention, x: torch.Tensor, lengths: torch.Tensor,
    output: torch.Tensor,
) -> Verdict:
    """Exercise 8.2: ``output`` is ``mha``'s self-attention over the padded
    batch ``x`` ``(B, L, d_model)`` where sentence ``b`` has ``lengths[b]``
    real tokens (then pads), no token attends a pad and no token sees its
    future."""
    if not isinstance(mha, MultiHeadAttention):
        return Verdict(
            False, f"mha should be a mha_lib.MultiHeadAttention, "
                   f"got {type(mha).__name__}")
    if (not isinstance(x, torch.Tensor) or x.dim() != 3
            or x.size(-1) != mha.d_model):
        got = (tuple(x.shape) if isinstance(x, torch.Tensor)
               else type(x).__name__)
        return Verdict(
            False, f"x should be the padded batch, expected shape "
                   f"(B, L, d_model) = (B, L, {mha.d_model}), got {got}")
    batch, length = x.shape[:2]
    if (not isinstance(lengths, torch.Tensor)
            or tuple(lengths.shape) != (batch,)):
        got = (tuple(lengths.shape) if isinstance(lengths, torch.Tensor)
               else type(lengths).__name__)
        return Verdict(
            False, f"lengths should be one length per sentence, expected "
                   f"shape (B,) = ({batch},), got {got}")
    if isinstance(output, tuple):
        return MASKED["pair"].verdict("output")
    pad = padding_mask(lengths, length)  # (B, 1, 1, Lk)
    causal = causal_mask(length)  # (Lq, Lk)

    def run(mask: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return mha(x, mask=mask)[0]

    return passed(check_tensor(
        "output", output, run(pad & causal), axes="(B, L, d_model)",
        mistakes=[
            (MASKED["padding_only"], lambda: run(pad)),
            (MASKED["causal_only"], lambda: run(causal)),
            (MASKED["either"], lambda: run(pad | causal)),
            (MASKED["inverted"], lambda: run(~(pad & causal))),
            (MASKED["no_mask"], lambda: run(None)),
            (MASKED["future"], lambda: run(pad & causal.mT)),
            (MASKED["future"], lambda: run(causal.mT)),
            (MASKED["off_by_one"], lambda: run(pad & causal.tril(-1))),
            (MASKED["off_by_one"], lambda: run(causal.tril(-1))),
            (MASKED["query_axis"], lambda: run(pad.mT & causal)),
        ]),
        "padding AND causal: each token sees the real tokens up to itself")


_MODULE = "Assembling the module"

PARAMETERS = catalogue(
    "check_num_parameters", 8,
    no_bias=("the biases are missing: with bias=True each of the four "
             "layers has d_model of them", _MODULE),
    bias_flag=("with bias=False there are no biases",
               "The library's module"),
    three_biases=("out_proj has a bias too: with bias=True each of the "
                  "four layers, q, k, v and out, has d_model biases",
                  "The output projection"),
    float_count=("a count of parameters is a whole number: return an "
                 "int (// rather than /, 4 rather than 4.0)", _MODULE),
    no_output=("the output projection is missing: four d_model x d_model "
               "layers, q, k, v and out", "The output projection"),
    per_head=("the heads only slice the four projections: their number "
              "does not enter the count", _MODULE),
    head_matrices=("that gives every head its own d_model x d_model "
                   "matrices; a head only gets D = d_model / H columns of "
                   "each projection, so all heads together hold one "
                   "d_model x d_model matrix per projection",
                   "Concatenating the heads"),
    head_squares=("that gives every head D x D matrices; a head reads all "
                  "d_model input features, so its block of each projection "
                  "is d_model x D", "Concatenating the heads"),
    one_bias=("each layer has d_model biases, one per output feature, "
              "not one: with bias=True that is 4 * d_model in all",
              _MODULE),
    head_biases=("each layer has d_model biases, one per output feature: "
                 "the heads slice them as they slice the weights, d_k = "
                 "d_model / H each, H * d_k = d_model in all", _MODULE),
    bias_per_head=("that gives every head its own d_model biases in each "
                   "layer; the heads slice each layer's d_model biases "
                   "as they slice its weights, so 4 * d_model in all",
                   _MODULE),
    built_module=("that builds a module and counts its parameters; the "
                  "exercise counts from the shapes alone", _MODULE),
)


def _built_module(record) -> object:
    """A module was made: its weights were allocated or initialised."""
    made = record.used(torch.empty, torch.Tensor.uniform_,
                       torch.Tensor.normal_, torch.Tensor.zero_,
                       torch.Tensor.fill_, torch.nn.init.kaiming_uniform_,
                       torch.nn.init.xavier_uniform_)
    return PARAMETERS["built_module"] if made else None


def _num_parameters(d_model: int, num_heads: int, bias: bool) -> int:
    # no use of the random state; sizes small enough to build
    with torch.random.fork_rng():
        module = MultiHeadAttention(d_model, num_heads, bias=bias)
    return sum(p.numel() for p in module.parameters())


def _wrong_counts(d: int, h: int, bias: bool) -> list:
    b = 4 * d if bias else 0
    return [(PARAMETERS["no_bias"], 4 * d * d),
            (PARAMETERS["bias_flag"], 4 * d * d + 4 * d),
            (PARAMETERS["three_biases"], 4 * d * d + 3 * b // 4),
            (PARAMETERS["no_output"], 3 * d * d + 3 * b // 4),
            (PARAMETERS["one_bias"], 4 * d * d + (4 if bias else 0)),
            (PARAMETERS["head_biases"], 4 * d * d + (4 * (d // h)
                                                     if bias else 0)),
            (PARAMETERS["bias_per_head"], 4 * d * d + b * h),
            (PARAMETERS["bias_per_head"], 4 * d * d + 3 * b // 4 * h
             + b // 4),
            (PARAMETERS["per_head"], (4 * d * d + b) // h),
            (PARAMETERS["head_matrices"], (4 * d * d + b) * h),
            (PARAMETERS["head_matrices"], 4 * h * d * d + b),
            (PARAMETERS["head_matrices"], 3 * h * d * d + d * d + b),
            (PARAMETERS["head_matrices"],
             h * (3 * d * d + 3 * b // 4) + d * d + b // 4),
            (PARAMETERS["head_squares"], 4 * h * (d // h) ** 2 + b)]


def check_num_parameters(fn: Callable[[int, int, bool], int]) -> Verdict:
    """Exercise 8.3: ``fn(d_model, num_heads, bias)`` is the number of
    parameters of ``MultiHeadAttention(d_model, num_heads, bias=bias)``,
    counted from the shapes alone (no module built)."""
    cases = ((8, 4, True), (8, 2, True), (512, 8, True), (512, 8, False),
             (768, 12, True), (96, 1, False))
    verdict = check_calls(
        fn, cases, _num_parameters,
        "4 * d_model**2, + 4 * d_model with bias, whatever num_heads",
        mistakes=_wrong_counts, refuse=_built_module)
    if not verdict:
        return verdict
    for args in cases:  # the right value: is it a whole number?
        call = attempt(fn, *args)
        value = call.value
        if isinstance(value, float) or (isinstance(value, torch.Tensor)
                                        and value.is_floating_point()):
            return PARAMETERS["float_count"].verdict(
                f"{call.label} = {value!r}")
    return verdict


_CROSS = "Cross-attention: 3 queries attend to 6 keys"
_SPLIT_VIEW = "The wrong way: `view` straight to `(B, H, L, D)`"
_SCALE = r"Why divide by $\sqrt{d_k}$"

FORWARD = catalogue(
    "check_mha_forward", 8,
    split_no_transpose=("the projections are cut into heads by reshaping "
                        "straight to (B, H, L, D): that mixes positions "
                        "and heads; reshape to (B, L, H, D), then "
                        "transpose(1, 2)", _SPLIT_VIEW, 5),
    merge_no_transpose=("the heads are merged by reshaping (B, H, L, D) "
                        "straight to (B, L, d_model): transpose(1, 2) "
                        "first", "The way back: `merge_heads`", 5),
    both_no_transpose=("both reshapes skip the transpose: the split "
                       "reshapes straight to (B, H, L, D) and the merge "
                       "straight back, so each head mixes positions; "
                       "split to (B, L, H, D) then transpose(1, 2), and "
                       "transpose back before merging", _SPLIT_VIEW, 5),
    no_out_proj=("out_proj is missing: the merged heads go through "
                 "layers['out_proj']", "The output projection"),
    scale_d_model=("the scores are divided by sqrt(d_model): a head's dot "
                   "products have d_k = d_model / H terms, so divide by "
                   "sqrt(d_k)", _SCALE, 6),
    unscaled=("the scores are not scaled: divide them by sqrt(d_k), "
              "d_k = d_model / H", _SCALE, 6),
    softmax_dim=("the softmax runs over the queries (dim=-2): each query's "
                 "weights must sum to 1 over the keys, dim=-1",
                 "The softmax: weights that sum to one", 6),
    swapped=("keys and values are swapped: k_proj reads key and v_proj "
             "reads value", _CROSS),
    keys_from_query=("the keys and values are projected from the query: "
                     "in cross-attention they come from key and value, "
                     "another sequence", _CROSS),
    k_from_query=("k_proj reads the query: the keys come from key, the "
                  "sequence attended to (the same tensor only in "
                  "self-attention)", _CROSS),
    v_from_key=("v_proj reads key: the values come from value (key and "
                "value differ in general)", _CROSS),
    no_mask=("the mask is ignored: fill the scores where mask is False "
             "with -inf before the softmax (chapter 7)",
             "Masks go straight through"),
    inverted=("the mask is inverted: True means \"may attend\", so fill "
              "the scores where ~mask", "Masks go straight through"),
    pair=("return the output tensor only, not (output, weights)",
          _MODULE),
    built_module=("that builds a module and loads the layers into it; the "
                  "exercise writes the forward from the four layers",
                  _MODULE),
    empty_row_nan=("a query that may attend no key (a left pad under the "
                   "causal mask) gets NaN: its scores are all -inf; "
                   "chapter 7's masked_softmax gives such a row zeros",
                   "A row with nothing to attend to", 7),
    empty_row_uniform=("a query that may attend no key (a left pad under "
                       "the causal mask) gets uniform weights from a "
                       "finite fill; the book gives it zeros, as chapter "
                       "7's masked_softmax does",
                       "A row with nothing to attend to", 7),
)


def _wrong_forward(layers: torch.nn.ModuleDict, num_heads: int,
                   query: torch.Tensor, key: torch.Tensor,
                   value: torch.Tensor, mask: torch.Tensor | None,
                   how: str, fill: float = float("-inf")) -> torch.Tensor:
    """The output of a classic wrong multi-head forward, ``how``; masked
    scores get ``fill``."""
    if how == "swapped":
        key, value = value, key
    if how == "keys_from_query":
        key = value = query
    if how == "k_from_query":
        key = query
    if how == "v_from_key":
        value = key
    q, k, v = (layers[name](t) for name, t in (
        ("q_proj", query), ("k_proj", key), ("v_proj", value)))
    batch, length, d_model = q.shape
    head_dim = d_model // num_heads

    def split(t: torch.Tensor) -> torch.Tensor:
        if how in ("split_no_transpose", "both_no_transpose"):
            return t.reshape(batch, num_heads, t.size(1), head_dim)
        return t.reshape(batch, t.size(1), num_heads,
                         head_dim).transpose(1, 2)

    scale = {"scale_d_model": d_model ** -0.5,
             "unscaled": 1.0}.get(how, head_dim ** -0.5)
    scores = split(q) @ split(k).transpose(-2, -1) * scale
    if mask is not None and how != "no_mask":
        keep = ~mask if how == "inverted" else mask
        scores = scores.masked_fill(~keep, fill)
    weights = scores.softmax(dim=-2 if how == "softmax_dim" else -1)
    heads = weights @ split(v)  # (B, H, Lq, D)
    if how in ("merge_no_transpose", "both_no_transpose"):
        merged = heads.reshape(batch, length, d_model)
    else:
        merged = heads.transpose(1, 2).reshape(batch, length, d_model)
    return merged if how == "no_out_proj" else layers["out_proj"](merged)


def check_mha_forward(
    fn: Callable[..., torch.Tensor],
) -> Verdict:
    """Exercise 8.4: ``fn(layers, num_heads, query, key, value, mask)`` is
    the output ``(B, Lq, d_model)`` of multi-head attention written from
    its four layers, ``layers["q_proj"]``, ``["k_proj"]``, ``["v_proj"]``
    and ``["out_proj"]`` (an ``nn.ModuleDict`` of ``nn.Linear``), with a
    bool ``mask`` (True = may attend) or ``None``. It must equal
    :class:`~mha_lib.MultiHeadAttention` holding the same weights."""
    generator = torch.Generator().manual_seed(84)
    # self-attention, padding & causal; cross-attention without a mask
    # (distinct key and value; first Lq = Lk, so that keys projected
    # from the query still run); cross-attention with the source's pads
    # last, left padding under the causal mask: the pads' rows see no key
    cases = ((2, 5, 5, 8, 4, "self"), (2, 3, 3, 10, 2, "cross"),
             (2, 4, 2, 6, 2, "cross"), (2, 3, 5, 12, 3, "source_pad"),
             (2, 5, 5, 8, 4, "left_pad"))
    for batch, lq, lk, d_model, heads, kind in cases:
        with torch.random.fork_rng():  # leave the reader's state alone
            torch.manual_seed(80 + d_model)
            layers = torch.nn.ModuleDict({
                name: torch.nn.Linear(d_model, d_model)
                for name in ("q_proj", "k_proj", "v_proj", "out_proj")})
            reference = MultiHeadAttention(d_model, heads)
        reference.load_state_dict(layers.state_dict())
        query = torch.randn(batch, lq, d_model, generator=generator)
        if kind in ("self", "left_pad"):
            key = value = query
            lengths = torch.tensor([4, 2])  # every sentence has pads
            mask = padding_mask(lengths, lk) & causal_mask(lq)
            if kind == "left_pad":  # the real tokens last
                real = torch.arange(lk) >= (lk - lengths)[:, None]
                mask = real[:, None, None, :] & causal_mask(lq)
        else:
            key = torch.randn(batch, lk, d_model, generator=generator)
            value = torch.randn(batch, lk, d_model, generator=generator)
            mask = (padding_mask(torch.tensor([lk, 2]), lk)
                    if kind == "source_pad" else None)
        with torch.no_grad():
            expected = reference(query, key, value, mask=mask)[0]
        shown = (f"layers, {heads}, query {tuple(query.shape)}, key "
                 f"{tuple(key.shape)}, value {tuple(value.shape)}, mask "
                 f"{None if mask is None else tuple(mask.shape)}")
        call = attempt(fn, layers, heads, query, key, value, mask,
                       shown=shown)
        if call.verdict is not None:
            return call.verdict
        if call.record.used(torch.nn.init.kaiming_uniform_,
                            torch.nn.init.xavier_uniform_,
                            torch.Tensor.uniform_):
            return FORWARD["built_module"].verdict(call.label)
        if isinstance(call.value, tuple):
            return FORWARD["pair"].verdict(call.label)
        if kind == "left_pad" and isinstance(call.value, torch.Tensor):
            empty = ~mask.any(-1).squeeze(1)  # (B, Lq): no key to attend
            rows = call.value.detach()[empty]
            if rows.isnan().any():
                return FORWARD["empty_row_nan"].verdict(call.label)
            if rows.shape == expected[empty].shape and not torch.allclose(
                    rows, expected[empty], atol=1e-5):
                return FORWARD["empty_row_uniform"].verdict(call.label)
        problem = check_tensor(
            call.label, call.value, expected, axes="(B, Lq, d_model)",
            mistakes=[(FORWARD[how], partial(
                _wrong_forward, layers, heads, query, key, value, mask,
                how)) for how in FORWARD if how not in (
                    "pair", "built_module", "empty_row_nan",
                    "empty_row_uniform")] + [
                # a column with no key left: NaN with -inf, finite with
                # a large negative fill, for a softmax over the queries
                (FORWARD["softmax_dim"], partial(
                    _wrong_forward, layers, heads, query, key, value,
                    mask, "softmax_dim", torch.finfo(query.dtype).min))])
        if problem is not None:
            return problem
    return Verdict(
        True, "project, split, attend with 1/sqrt(d_k) per head, merge, "
              "out_proj: equal to MultiHeadAttention with these weights")
