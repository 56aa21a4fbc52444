"""ALiBi: attention with linear biases (chapter 17).

Shape legend: H - heads, Lq - query length, Lk - key length.

No position vector at all: each head adds ``-m_h * (distance)`` to its
scores, so far keys are penalised linearly, with a slope ``m_h`` per head
(Press et al., 2022).
"""

from __future__ import annotations

import math

import torch

from mha_lib.masks import _check_lengths

__all__ = ["alibi_bias", "alibi_slopes"]


def alibi_slopes(num_heads: int) -> list[float]:
    """The paper's head slopes: for ``H`` a power of two, the geometric
    sequence ``2^(-8/H), 2^(-16/H), ..., 2^(-8)``; otherwise the slopes of
    the nearest smaller power of two ``P``, followed by every other slope
    of ``2P`` heads, until there are ``H``.

    Args:
        num_heads: The number of heads ``H``, one slope each.
    """
    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if num_heads & (num_heads - 1) == 0:
        return power_of_two(num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))
    extra = power_of_two(2 * closest)[0::2][:num_heads - closest]
    return power_of_two(closest) + extra


def alibi_bias(num_heads: int, q_len: int, k_len: int | None = None,
               device: torch.device | str | None = None) -> torch.Tensor:
    """ALiBi's bias ``(H, Lq, Lk)``, float32: ``m_h * (j - p)`` for query
    ``i`` at position ``p = i + Lk - Lq`` (aligned bottom-right, like
    :func:`~mha_lib.causal_mask`) and key ``j``, with the paper's slopes
    ``m_h``.

    It is 0 on the diagonal and ``-m_h`` times the distance for past keys.
    For keys after the query it is positive: it is a bias, not a mask, so
    pass ``is_causal=True`` (or add a causal mask) as a decoder does. Use
    it as a float mask, ``mask=alibi_bias(H, L)[None]``.
    Derived in chapter 17.

    Args:
        num_heads: The number of heads ``H``, one slope each.
        q_len: The number of queries ``Lq``.
        k_len: The number of keys ``Lk``; defaults to ``q_len``.
        device: Where to create the bias (default: PyTorch's default
            device).

    Example:
        >>> bias = alibi_bias(num_heads=2, q_len=3)  # added to the scores
        >>> bias.shape
        torch.Size([2, 3, 3])
    """
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) \
            or num_heads < 1:
        raise ValueError(f"num_heads: expected a positive int, "
                         f"got {num_heads!r}")
    k_len = q_len if k_len is None else k_len
    _check_lengths(q_len=q_len, k_len=k_len)
    slopes = torch.tensor(alibi_slopes(num_heads), device=device)  # (H,)
    query_pos = torch.arange(q_len, device=device) + (k_len - q_len)
    key_pos = torch.arange(k_len, device=device)  # (Lk,)
    distance = key_pos[None, :] - query_pos[:, None]  # (Lq, Lk): j - p
    return slopes[:, None, None] * distance  # (H, Lq, Lk)
