"""Scaled dot-product attention and the masked softmax under it (chapters 6
and 7).

Shape legend: ... - any leading dims (batch, heads), Lq - query length,
Lk - key length, D - query/key dim, Dv - value dim.

Masks are bool, True = may attend, or float, added to the scores. Masked
scores are set to ``-inf``: exactly zero weight after the softmax, in every
dtype, with no magic number that could overflow float16 (chapter 7 shows
how minus a billion does). A row with nothing to attend to would be
``softmax([-inf, ..., -inf]) = 0/0 = NaN``; we define its weights (and so
its output) as zeros, the only answer that says "nothing seen".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from numbers import Real

import torch

from mha_lib._checks import check_dtype, check_mask

__all__ = ["masked_softmax", "scaled_dot_product_attention"]

_HALF = (torch.float16, torch.bfloat16)


def masked_softmax(scores: torch.Tensor,
                   mask: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax over the last dim of ``scores`` ``(..., Lq, Lk)``, skipping
    masked keys.

    Fully masked rows give all-zero weights, never NaN. Half-precision
    scores are normalised in float32 and returned in their own dtype.
    Derived in chapter 7.

    Args:
        scores: Attention scores ``(..., Lq, Lk)``, floating point.
        mask: bool (True = may attend) or float (added to the scores),
            broadcastable to ``scores``; None attends everywhere.

    Example:
        >>> scores = torch.zeros(2, 3)
        >>> mask = torch.tensor([[True, True, False],
        ...                      [False, False, False]])
        >>> masked_softmax(scores, mask).tolist()  # empty row: zeros
        [[0.5, 0.5, 0.0], [0.0, 0.0, 0.0]]
    """
    _check_scores(scores)
    if mask is not None:
        check_mask(mask, scores.shape, _letters(scores), scores.dtype)
    x = scores.float() if scores.dtype in _HALF else scores
    if mask is None:
        return torch.softmax(x, dim=-1).to(scores.dtype)
    if mask.dtype == torch.bool:
        x = x.masked_fill(~mask, float("-inf"))
    else:
        x = x + mask.to(x.dtype)
    # The rows with nothing to attend to:
    empty = (x == float("-inf")).all(dim=-1, keepdim=True)  # (..., Lq, 1)
    # Keeps softmax (and its gradient) finite on those rows:
    x = x.masked_fill(empty, 0.0)
    # (..., Lq, Lk), all zeros on the rows with nothing to attend to:
    weights = torch.softmax(x, dim=-1).masked_fill(empty, 0.0)
    return weights.to(scores.dtype)


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None = None,
    dropout: Callable[[torch.Tensor], torch.Tensor] | None = None,
    *,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``softmax(Q K^T / sqrt(D)) V``, written out so the weights can be
    returned.

    Returns ``(output (..., Lq, Dv), weights (..., Lq, Lk))``. Derived in
    chapter 6.

    Args:
        query: Queries ``(..., Lq, D)``.
        key: Keys ``(..., Lk, D)``.
        value: Values ``(..., Lk, Dv)``.
        mask: bool (True = may attend) or float (added to the scores),
            broadcastable to ``(..., Lq, Lk)``; None attends everywhere.
        dropout: Applied to the weights before they average the values
            (e.g. an ``nn.Dropout``); None for no dropout.
        scale: Multiplies the scores; defaults to ``1 / sqrt(D)``.

    Example:
        >>> q = torch.randn(2, 4, 8)  # (B, Lq, D)
        >>> k, v = torch.randn(2, 5, 8), torch.randn(2, 5, 8)  # (B, Lk, D)
        >>> out, weights = scaled_dot_product_attention(
        ...     q, k, v, mask=causal_mask(4, 5))
        >>> out.shape, weights.shape  # (B, Lq, Dv), (B, Lq, Lk)
        (torch.Size([2, 4, 8]), torch.Size([2, 4, 5]))
        >>> weights.sum(dim=-1).round(decimals=4).tolist()[0]
        [1.0, 1.0, 1.0, 1.0]
    """
    _check_qkv(query, key, value)
    _check_options(mask, dropout, scale)
    # Half inputs: scores in float32, so large dot products cannot overflow.
    q, k = ((query.float(), key.float()) if query.dtype in _HALF
            else (query, key))
    # (..., Lq, D) @ (..., D, Lk) -> (..., Lq, Lk)
    scores = q @ k.transpose(-2, -1)
    scores = (scores / math.sqrt(query.size(-1)) if scale is None
              else scores * scale)
    if mask is not None and mask.is_floating_point():
        mask = check_mask(mask, scores.shape, _letters(scores),
                          query.dtype).to(scores.dtype)
    weights = masked_softmax(scores, mask).to(query.dtype)  # (..., Lq, Lk)
    if dropout is not None:
        weights = dropout(weights)
    # (..., Lq, Lk) @ (..., Lk, Dv) -> (..., Lq, Dv)
    return weights @ value, weights


def _letters(scores: torch.Tensor) -> str:
    return " ".join(
        (["..."] * (scores.dim() - 2) + ["Lq", "Lk"])[-scores.dim():])


def _check_scores(scores: torch.Tensor) -> None:
    if not isinstance(scores, torch.Tensor):
        raise TypeError(f"scores: expected a torch.Tensor (..., Lq, Lk), "
                        f"got {type(scores).__name__}")
    if scores.dim() == 0:
        raise ValueError("scores: expected at least 1 dim (..., Lk), "
                         "got a 0-D tensor")
    if not scores.is_floating_point():
        raise TypeError(f"scores: expected a floating-point tensor, "
                        f"got dtype {scores.dtype}")


def _check_options(mask: object, dropout: object, scale: object) -> None:
    if mask is not None and not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask: expected a bool or float tensor, "
                        f"got {type(mask).__name__}")
    if dropout is not None and not callable(dropout):
        raise TypeError(f"dropout: expected a callable applied to the "
                        f"weights (e.g. nn.Dropout(p)) or None, "
                        f"got {dropout!r}")
    if scale is not None and (isinstance(scale, bool)
                              or not isinstance(scale, Real)):
        raise TypeError(f"scale: expected a float or None, got {scale!r}")


def _check_qkv(query: torch.Tensor, key: torch.Tensor,
               value: torch.Tensor) -> None:
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, "
                            f"got {type(x).__name__}")
        if x.dim() < 2:
            raise ValueError(f"{name}: expected at least 2 dims "
                             f"(..., L, D), got shape {tuple(x.shape)}")
        if not x.is_floating_point():
            raise TypeError(f"{name}: expected a floating-point tensor, "
                            f"got dtype {x.dtype}")
        check_dtype(name, x, query.dtype, "the query's")
    if query.size(-1) == 0:
        raise ValueError(f"query: expected a feature dim D >= 1 (the scale "
                         f"is 1/sqrt(D)), got shape {tuple(query.shape)}")
    if key.size(-1) != query.size(-1):
        raise ValueError(f"key: expected last dim D={query.size(-1)} "
                         f"(the query's), got shape {tuple(key.shape)}")
    if value.size(-2) != key.size(-2):
        raise ValueError(f"value: expected Lk={key.size(-2)} rows "
                         f"(the key's length), "
                         f"got shape {tuple(value.shape)}")
    # The leading dims (batch, heads) broadcast:
    for name, x in (("key", key), ("value", value)):
        try:
            torch.broadcast_shapes(query.shape[:-2], x.shape[:-2])
        except RuntimeError:
            raise ValueError(
                f"{name}: expected leading dims that broadcast with the "
                f"query's {tuple(query.shape[:-2])}, "
                f"got shape {tuple(x.shape)}") from None
