"""Checkers for chapter 5's exercises (splitting into heads)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace

import torch

from mha_lib.exercises.verdict import (
    Mistake,
    Verdict,
    attempt,
    catalogue,
    check_tensor,
)
from mha_lib.heads import merge_heads, split_heads

__all__ = ["check_split_heads", "check_head_columns", "check_merge_heads"]

# (B, L, d_model, H): the running example first, then shapes where mistakes
# show.
_CASES = ((3, 6, 8, 4), (2, 5, 12, 3), (1, 4, 6, 6), (2, 3, 8, 1))

_WRONG_WAY = "The wrong way: `view` straight to `(B, H, L, D)`"
_COLUMNS = "Which features belong to which head"
_BACK = "The way back: `merge_heads`"

_PERMUTE = (torch.permute, torch.Tensor.permute)
_TRANSPOSE = (torch.transpose, torch.Tensor.transpose)


def _inputs() -> list[tuple[torch.Tensor, int]]:
    """Queries ``(B, L, d_model)`` and a number of heads; the last is a
    third of a fused projection's output, not contiguous, as a real
    pipeline makes them."""
    generator = torch.Generator().manual_seed(5)
    cases = [(torch.randn(b, length, d, generator=generator), h)
             for b, length, d, h in _CASES]
    fused = torch.randn(2, 5, 3 * 8, generator=generator)  # (B, L, 3 d)
    cases.append((fused.chunk(3, dim=-1)[1], 2))  # (B, L, d), strided
    return cases


_SIZES = re.compile(r"shape '\[([-\d, ]+)\]' is invalid")


def _hard_coded(mistake: Mistake) -> Callable[[BaseException, object],
                                               Mistake | None]:
    """Name the shape a solution wrote in numbers, when PyTorch refuses it
    for an input of another size."""
    def explain(error: BaseException, record: object) -> Mistake | None:
        found = _SIZES.search(str(error))
        if found is None:
            return None
        return replace(mistake, hint=f"A size in the shape "
                                     f"({found.group(1)}) is written as a "
                                     f"number: {mistake.hint}")
    return explain


SPLIT = catalogue(
    "check_split_heads", 5,
    hard_coded=("it fits the running example only; read B, L and "
                "d_model from x.shape and compute D = d_model // "
                "num_heads, since the checker tries other sizes", _COLUMNS),
    heads_fixed=("the number of heads (or D) is written as a number, "
                 "the running example's H = 4 (or D = 2): take H from "
                 "the num_heads argument and compute D = d_model // "
                 "num_heads, since the checker tries other sizes",
                 _COLUMNS),
    plain_view=("that is x.view(B, H, L, D): the right shape, but each "
                "head mixes tokens; view as (B, L, H, D), then swap L and "
                "H", _WRONG_WAY),
    no_swap=("that is (B, L, H, D): the head axis must come before the "
             "length axis, permute(0, 2, 1, 3)", _COLUMNS),
    strided=("head h gets every H-th feature; it owns a block of D "
             "neighbouring features: view as (B, L, H, D), not "
             "(B, L, D, H)", _COLUMNS),
    wrong_permute=("that is (B, H, D, L): permute lists the old axes in "
                   "their new order, permute(0, 2, 1, 3)", _COLUMNS),
    wrong_transpose=("that is (B, L, D, H): transpose(2, 3) swaps heads "
                     "and features; swap length and heads, "
                     "permute(0, 2, 1, 3)", _COLUMNS),
    batch_swapped=("that is (H, L, B, D): transpose(0, 2) swaps the "
                   "batch axis with the heads; the batch stays first, "
                   "swap length and heads: transpose(1, 2), or "
                   "permute(0, 2, 1, 3)", _COLUMNS),
    transpose_first=("that transposes before it splits: x.transpose(1, 2) "
                     "is (B, H*D, L), and cutting that into (B, H, L, D) "
                     "mixes features and tokens; split the last axis "
                     "first, view(B, L, H, D), then move the head axis",
                     _COLUMNS),
)


def _permute_verdict(record, try_: str, done: str) -> Verdict:
    """Right values: accepted; without the asked-for permute, say what was
    used (the chapter's transpose, or neither) and what to try."""
    if record.used(*_PERMUTE):
        return Verdict(True, done)
    how = ("with the chapter's transpose(1, 2)"
           if record.used(*_TRANSPOSE) else "without permute")
    return Verdict(True, f"right values, {how}; the exercise asks for "
                         f"permute: try {try_}")


def check_split_heads(
    fn: Callable[[torch.Tensor, int], torch.Tensor],
) -> Verdict:
    """Exercise 5.1: ``fn(x, num_heads)`` maps ``(B, L, H*D)`` to
    ``(B, H, L, D)`` as :func:`~mha_lib.split_heads` does, with ``view``
    (or ``reshape``) and ``permute``."""
    for x, num_heads in _inputs():
        batch, length, d_model = x.shape
        head_dim = d_model // num_heads
        call = attempt(fn, x, num_heads,
                       shown=f"x {tuple(x.shape)}, num_heads={num_heads}",
                       explain=_hard_coded(SPLIT["hard_coded"]))
        if call.verdict is not None:
            return call.verdict
        problem = check_tensor(
            call.label, call.value, split_heads(x, num_heads),
            axes="(B, H, L, D)", atol=0.0, rtol=0.0, mistakes=[
                (SPLIT["plain_view"],
                 x.reshape(batch, num_heads, length, head_dim)),
                (SPLIT["no_swap"],
                 x.reshape(batch, length, num_heads, head_dim)),
                (SPLIT["strided"], x.reshape(
                    batch, length, head_dim, num_heads).permute(
                        0, 3, 1, 2)),
                (SPLIT["wrong_permute"], x.reshape(
                    batch, length, num_heads, head_dim).permute(
                        0, 2, 3, 1)),
                (SPLIT["wrong_transpose"], x.reshape(
                    batch, length, num_heads, head_dim).transpose(2, 3)),
                (SPLIT["batch_swapped"], x.reshape(
                    batch, length, num_heads, head_dim).transpose(0, 2)),
                (SPLIT["transpose_first"], x.transpose(1, 2).reshape(
                    batch, num_heads, length, head_dim)),
                *[(SPLIT["heads_fixed"], x.reshape(
                    batch, length, h, d_model // h).transpose(1, 2))
                  for h in (4, d_model // 2)
                  if h != num_heads and d_model % h == 0],
            ])
        if problem is not None:
            return problem
        record = call.record
    return _permute_verdict(
        record, "view, then permute(0, 2, 1, 3)",
        "(B, L, H*D) -> (B, H, L, D), head h = columns h*D..(h+1)*D-1")


MERGE = catalogue(
    "check_merge_heads", 5,
    view_not_contiguous=("view cannot merge the axes of an attention "
                         "output after the permute (or transpose): its "
                         "memory is no "
                         "longer contiguous; use reshape (or "
                         ".contiguous().view)", _BACK),
    reshape_only=("the reshape alone reads the numbers in (B, H, L, D) "
                  "index order, head by head, whatever the strides, and "
                  "mixes tokens: permute to (B, L, H, D) first", _BACK),
    dimension_major=("the features come out dimension by dimension, the "
                     "heads interleaved: permute to (B, L, H, D), not "
                     "(B, L, D, H)", _BACK),
    hard_coded=("it fits the running example only; read B, H, L and D "
                "from x.shape, since the checker tries other sizes", _BACK),
)


def _explain_merge(error: BaseException, record) -> object:
    if "view size is not compatible" in str(error):
        return MERGE["view_not_contiguous"]
    return _hard_coded(MERGE["hard_coded"])(error, record)


def check_merge_heads(
    fn: Callable[[torch.Tensor], torch.Tensor],
) -> Verdict:
    """Exercise 5.3: ``fn(x)`` maps ``(B, H, L, D)`` back to ``(B, L, H*D)``
    as :func:`~mha_lib.merge_heads` does, with ``permute`` and a reshape,
    for real attention outputs (contiguous ``(B, H, L, D)`` tensors) and
    for the output of :func:`~mha_lib.split_heads`."""
    cases = []
    for x, num_heads in _inputs():
        heads = split_heads(x, num_heads)  # (B, H, L, D), a strided view
        cases += [heads.contiguous(), heads]  # attention output, a view
    for heads in cases:
        batch, num_heads, length, head_dim = heads.shape
        call = attempt(fn, heads, explain=_explain_merge)
        if call.verdict is not None:
            return call.verdict
        problem = check_tensor(
            call.label, call.value, merge_heads(heads),
            axes="(B, L, H*D)", atol=0.0, rtol=0.0, mistakes=[
                (MERGE["reshape_only"],
                 heads.reshape(batch, length, num_heads * head_dim)),
                (MERGE["dimension_major"], heads.permute(
                    0, 2, 3, 1).reshape(batch, length,
                                        num_heads * head_dim)),
            ])
        if problem is not None:
            return problem
        record = call.record
    return _permute_verdict(
        record, "permute(0, 2, 1, 3), then reshape",
        "(B, H, L, D) -> (B, L, H*D); fn(split_heads(x, H)) is x")


COLUMNS = catalogue(
    "check_head_columns", 5,
    strided=("that takes every H-th column; head h owns the D "
             "neighbouring columns h*D .. (h+1)*D - 1", _COLUMNS),
    width_is_heads=("the block width is D = d_model // num_heads, not "
                    "num_heads", _COLUMNS),
    one_too_many=("one column too many: a slice leaves out its end, so "
                  "head h is x[..., h*D:(h+1)*D]", _COLUMNS),
    wrong_axis=("that slices positions, not features: x[:, h*D:(h+1)*D] "
                "cuts the token axis L; head h is a block of columns, "
                "on the last axis: x[..., h*D:(h+1)*D]", _COLUMNS),
    reshaped=("the exercise slices columns, without view, reshape or "
              "permute", _COLUMNS),
    hard_coded=("the block width is written as a number: D = d_model // "
                "num_heads, 2 only in the running example; the checker "
                "tries other sizes", _COLUMNS),
    wrong_split=("that is head h of x.view(B, H, L, D), the wrong split: "
                 "its rows cut across tokens; head h is the block of D "
                 "columns h*D .. (h+1)*D - 1 of every token", _WRONG_WAY),
)

_RESHAPES = (torch.Tensor.view, torch.Tensor.reshape, torch.reshape,
             torch.Tensor.unflatten, torch.unflatten, torch.Tensor.permute,
             torch.permute, torch.Tensor.transpose, torch.transpose,
             torch.Tensor.movedim, torch.movedim, torch.Tensor.flatten,
             torch.flatten)


def check_head_columns(
    fn: Callable[[torch.Tensor, int, int], torch.Tensor],
) -> Verdict:
    """Exercise 5.2: ``fn(x, h, num_heads)`` returns head ``h`` of ``x``
    ``(B, L, H*D)`` as a ``(B, L, D)`` tensor, the same as
    ``split_heads(x, num_heads)[:, h]``, by slicing columns (no
    reshape)."""
    for x, num_heads in _inputs():
        head_dim = x.size(-1) // num_heads
        for h in range(num_heads):
            call = attempt(fn, x, h, num_heads,
                           shown=f"x {tuple(x.shape)}, h={h}, "
                                 f"num_heads={num_heads}")
            if call.verdict is not None:
                return call.verdict
            problem = check_tensor(
                call.label, call.value, split_heads(x, num_heads)[:, h],
                axes="(B, L, D)", atol=0.0, rtol=0.0, mistakes=[
                    (COLUMNS["wrong_split"], x.reshape(
                        x.size(0), num_heads, x.size(1), head_dim)[:, h]),
                    (COLUMNS["wrong_axis"],
                     x[:, h * head_dim:(h + 1) * head_dim]),
                    (COLUMNS["strided"], x[..., h::num_heads]),
                    (COLUMNS["width_is_heads"],
                     x[..., h * num_heads:(h + 1) * num_heads]),
                    (COLUMNS["one_too_many"],
                     x[..., h * head_dim:(h + 1) * head_dim + 1]),
                    *[(COLUMNS["hard_coded"], x[..., h * w:(h + 1) * w])
                      for w in (2,) if w != head_dim],
                ])
            if problem is not None:
                return problem
            if call.record.used(*_RESHAPES):
                return COLUMNS["reshaped"].verdict(call.label)
    return Verdict(
        True, "head h is a block of D neighbouring columns of every token")
