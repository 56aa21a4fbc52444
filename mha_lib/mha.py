"""The multi-head attention module the book builds (chapter 8).

Shape legend: B - batch, Lq/Lk - query/key length, H - heads, D - head dim,
d_model = H * D.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mha_lib._checks import check_mask, check_positive_int, check_tensor
from mha_lib.attention import scaled_dot_product_attention
from mha_lib.heads import merge_heads, split_heads

__all__ = ["MultiHeadAttention"]


class MultiHeadAttention(nn.Module):
    """Multi-head attention with batch-first inputs ``(B, L, d_model)``.

    ``forward(query, key=None, value=None, mask=None, need_weights=True)`` returns
    ``(output (B, Lq, d_model), weights (B, H, Lq, Lk) or None)``. ``key`` defaults to
    ``query`` (self-attention) and ``value`` to ``key``. ``mask`` is bool (True = may
    attend) or float (added to the scores), broadcastable to ``(B, H, Lq, Lk)``; a query
    with nothing to attend to gets a zero attention output (so the module returns
    ``out_proj.bias`` there), never NaN.

    ``need_weights=True`` runs the explicit path derived in the book and returns the
    weights; ``need_weights=False`` runs PyTorch's fused
    ``F.scaled_dot_product_attention`` and returns ``None`` for the weights. Both
    give the same output. Derived in chapter 8.
    """

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("num_heads", num_heads)
        if d_model % num_heads:
            raise ValueError(f"num_heads: expected a divisor of d_model={d_model}, "
                             f"got num_heads={num_heads}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout: expected a probability in [0, 1), got {dropout!r}")
        self.d_model = d_model
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.attn_dropout = nn.Dropout(dropout)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        need_weights: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        key = query if key is None else key
        value = key if value is None else value
        self._check_inputs(query, key, value, mask)
        if need_weights:
            q = split_heads(self.q_proj(query), self.num_heads)  # (B, H, Lq, D)
            k = split_heads(self.k_proj(key), self.num_heads)  # (B, H, Lk, D)
            v = split_heads(self.v_proj(value), self.num_heads)  # (B, H, Lk, D)
            out, weights = scaled_dot_product_attention(q, k, v, mask, self.attn_dropout)
        else:
            out, weights = self._fused_attention(query, key, value, mask), None
        return self.out_proj(merge_heads(out)), weights  # (B, Lq, d_model)

    def _fused_attention(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         mask: torch.Tensor | None) -> torch.Tensor:
        """The same attention on PyTorch's fused kernel: ``(B, H, Lq, D)``."""
        if key is query and value is query:  # self-attention: one matmul makes Q, K and V
            weight = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])
            bias = None
            if self.q_proj.bias is not None:
                bias = torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias])
            q, k, v = F.linear(query, weight, bias).chunk(3, dim=-1)  # 3 x (B, L, d_model)
        else:
            q, k, v = self.q_proj(query), self.k_proj(key), self.v_proj(value)
        q, k, v = (split_heads(t, self.num_heads) for t in (q, k, v))  # (B, H, L, D)
        dropout_p = self.dropout if self.training else 0.0
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
        # A query row that may attend nothing: let the kernel attend everything (finite
        # numbers and gradients), then zero that row, as the explicit path does.
        if mask.dtype == torch.bool:
            empty = ~mask.any(dim=-1, keepdim=True)  # (..., Lq, 1)
            mask = mask | empty
        else:
            empty = (mask == float("-inf")).all(dim=-1, keepdim=True)  # (..., Lq, 1)
            mask = mask.masked_fill(empty, 0.0)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        return out.masked_fill(empty, 0.0)  # (B, H, Lq, D)

    def _check_inputs(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      mask: torch.Tensor | None) -> None:
        check_tensor("query", query, ("B", "Lq", self.d_model))
        batch = query.size(0)
        check_tensor("key", key, (batch, "Lk", self.d_model))
        check_tensor("value", value, (batch, key.size(1), self.d_model))
        if mask is not None:
            check_mask(mask, (batch, self.num_heads, query.size(1), key.size(1)),
                       "B H Lq Lk", query.dtype)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, num_heads={self.num_heads}, dropout={self.dropout}"
