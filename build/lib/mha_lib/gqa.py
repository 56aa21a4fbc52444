"""Grouped-query and multi-query attention: fewer key/value heads
(chapter 14).

Shape legend: B - batch, L - length, H - query heads, H_kv - key/value
heads, G = H / H_kv - query heads per key/value head, D - head dim
(d_model = H * D). ``H_kv = H`` is multi-head attention, ``H_kv = 1``
multi-query attention.
"""

from __future__ import annotations

import torch
from torch import nn

from mha_lib._checks import check_positive_int
from mha_lib.attention import scaled_dot_product_attention
from mha_lib.mha import MultiHeadAttention

__all__ = ["GroupedQueryAttention"]


class GroupedQueryAttention(MultiHeadAttention):
    """:class:`~mha_lib.MultiHeadAttention` whose keys and values have
    ``num_kv_heads`` heads, each shared by ``num_heads // num_kv_heads``
    query heads.

    ``k_proj`` and ``v_proj`` map ``d_model`` to
    ``num_kv_heads * head_dim``, so they (and a :class:`~mha_lib.KVCache`)
    are ``num_heads / num_kv_heads`` times smaller. ``forward`` is the
    parent's: same arguments, same ``(output, weights | None)``. Neither
    path copies the keys and values once per query head: the explicit path
    groups the queries by a reshape, the fused one asks
    ``F.scaled_dot_product_attention`` for ``enable_gqa=True``. Chapter 14.

    Args:
        d_model: Width of every token vector, ``H * D``.
        num_heads: Number of query heads ``H``; must divide ``d_model``.
        num_kv_heads: Number of key/value heads ``H_kv``; must divide
            ``num_heads``.
        dropout: Probability of zeroing an attention weight in training.
        bias: Whether the four linear layers have biases.

    Example:
        >>> gqa = GroupedQueryAttention(16, num_heads=4, num_kv_heads=2)
        >>> out, weights = gqa(torch.randn(2, 6, 16), is_causal=True)
        >>> out.shape, weights.shape  # 4 query heads, 2 key/value heads
        (torch.Size([2, 6, 16]), torch.Size([2, 4, 6, 6]))
    """

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int,
                 dropout: float = 0.0, bias: bool = True):
        super().__init__(d_model, num_heads, dropout, bias)
        check_positive_int("num_kv_heads", num_kv_heads)
        if num_heads % num_kv_heads:
            raise ValueError(f"num_kv_heads: expected a divisor of "
                             f"num_heads={num_heads}, "
                             f"got num_kv_heads={num_kv_heads}")
        self.num_kv_heads = num_kv_heads
        kv_dim = num_kv_heads * self.head_dim
        self.k_proj = nn.Linear(d_model, kv_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, kv_dim, bias=bias)

    def _explicit_attention(self, q: torch.Tensor, k: torch.Tensor,
                            v: torch.Tensor, mask: torch.Tensor | None
                            ) -> tuple[torch.Tensor, torch.Tensor]:
        """Query head ``h`` reads key/value head ``h // G``: stack each
        group's ``G`` query heads as rows of one matrix, ``(B, H_kv, G*Lq,
        D)``, so each key/value head is read as it is. (Broadcasting
        ``(B, H_kv, G, Lq, D)`` against ``(B, H_kv, 1, Lk, D)`` would not
        do: ``matmul`` copies K and V ``G`` times to broadcast.)"""
        B, H, Lq, D = q.shape  # noqa: N806
        group = H // self.num_kv_heads
        q = q.reshape(B, self.num_kv_heads, group * Lq, D)
        if mask is not None:  # (Lq, Lk) or (B|1, H|1, Lq|1, Lk)
            mask = mask.reshape((1, 1) * (mask.dim() == 2) + mask.shape)
            mask = mask.expand(-1, -1, Lq, -1)  # a row for every query
            mask = (mask.unsqueeze(2).expand(-1, -1, group, -1, -1)
                    if mask.size(1) == 1  # (B|1, 1, G, Lq, Lk)
                    else mask.unflatten(1, (self.num_kv_heads, group)))
            mask = mask.flatten(2, 3)  # (B|1, 1|H_kv, G*Lq, Lk)
        out, weights = scaled_dot_product_attention(
            q, k, v, mask, self.attn_dropout)  # (B, H_kv, G*Lq, ...)
        return (out.reshape(B, H, Lq, -1),
                weights.reshape(B, H, Lq, -1))  # (B, H, Lq, ...)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, "
                f"num_kv_heads={self.num_kv_heads}, dropout={self.dropout}")
