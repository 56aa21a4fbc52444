"""Grouped-query and multi-query attention: fewer key/value heads (chapter 14).

Shape legend: B - batch, L - length, H - query heads, H_kv - key/value heads,
D - head dim (d_model = H * D). Each key/value head serves ``H / H_kv`` query heads:
``H_kv = H`` is multi-head attention, ``H_kv = 1`` multi-query attention.
"""

from __future__ import annotations

import torch
from torch import nn

from mha_lib._checks import check_positive_int
from mha_lib.mha import MultiHeadAttention

__all__ = ["GroupedQueryAttention"]


class GroupedQueryAttention(MultiHeadAttention):
    """:class:`~mha_lib.MultiHeadAttention` whose keys and values have ``num_kv_heads``
    heads, each shared by ``num_heads // num_kv_heads`` query heads.

    ``k_proj`` and ``v_proj`` map ``d_model`` to ``num_kv_heads * head_dim``, so they (and a
    :class:`~mha_lib.KVCache`) are ``num_heads / num_kv_heads`` times smaller. ``forward``
    is the parent's: same arguments, same ``(output, weights | None)``. Chapter 14.
    """

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int, dropout: float = 0.0,
                 bias: bool = True):
        super().__init__(d_model, num_heads, dropout, bias)
        check_positive_int("num_kv_heads", num_kv_heads)
        if num_heads % num_kv_heads:
            raise ValueError(f"num_kv_heads: expected a divisor of num_heads={num_heads}, "
                             f"got num_kv_heads={num_kv_heads}")
        self.num_kv_heads = num_kv_heads
        self.k_proj = nn.Linear(d_model, num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, num_kv_heads * self.head_dim, bias=bias)

    def _expand_kv(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, H_kv, L, D)`` -> ``(B, H, L, D)``: key/value head ``g`` is repeated for
        query heads ``g * H/H_kv`` to ``(g + 1) * H/H_kv - 1``."""
        return x.repeat_interleave(self.num_heads // self.num_kv_heads, dim=1)  # (B, H, L, D)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, "
                f"num_kv_heads={self.num_kv_heads}, dropout={self.dropout}")
