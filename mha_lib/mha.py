"""The multi-head attention module the book builds (chapter 8).

Shape legend: B - batch, Lq/Lk - query/key length, H - heads, D - head dim,
d_model = H * D, H_kv - key/value heads (= H here; fewer in ``gqa``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mha_lib._checks import check_dtype, check_mask, check_positive_int, check_tensor
from mha_lib.attention import scaled_dot_product_attention
from mha_lib.cache import KVCache, LayerCache
from mha_lib.heads import merge_heads, split_heads
from mha_lib.linear import fast_linear

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
    give the same output (up to float32 rounding). Derived in chapter 8. The fused path
    calls the four linear layers' weights through ``fast_linear`` (oneDNN's matrix
    product for float32 on the CPU, chapter 13), so forward hooks on those layers run
    only on the explicit path.

    ``cache`` (keyword, a :class:`~mha_lib.cache.KVCache` or one of its layers) is for
    decoding: the new keys and values are appended to it and the queries attend to all
    cached positions (``mask`` then covers ``Lk = L_past + Lk_new``). Chapter 14.
    """

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("num_heads", num_heads)
        if d_model % num_heads:
            raise ValueError(f"num_heads: expected a divisor of d_model={d_model}, "
                             f"got num_heads={num_heads}")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) \
                or not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout: expected a probability in [0, 1), got {dropout!r}")
        self.d_model = d_model
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.num_kv_heads = num_heads  # heads of K and V: fewer in GroupedQueryAttention
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
        *,
        cache: KVCache | LayerCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        key = query if key is None else key
        value = key if value is None else value
        self._check_inputs(query, key, value, mask, cache)
        fast = not need_weights  # the fused path: every step on the fastest kernel at hand
        q = self._project(self.q_proj, query, fast)  # (B, Lq, d_model)
        k = self._project(self.k_proj, key, fast)  # (B, Lk, H_kv * D)
        v = self._project(self.v_proj, value, fast)  # (B, Lk, H_kv * D)
        q = split_heads(q, self.num_heads)  # (B, H, Lq, D)
        k = split_heads(k, self.num_kv_heads)  # (B, H_kv, Lk, D)
        v = split_heads(v, self.num_kv_heads)  # (B, H_kv, Lk, D)
        if cache is not None:  # decoding (chapter 14): append, then attend to all positions
            k, v = cache.update(k, v)  # (B, H_kv, L_past + Lk, D)
        k, v = self._expand_kv(k), self._expand_kv(v)  # (B, H, Lk, D)
        if need_weights:
            out, weights = scaled_dot_product_attention(q, k, v, mask, self.attn_dropout)
        else:
            out, weights = self._fused_attention(q, k, v, mask), None
        return self._project(self.out_proj, merge_heads(out), fast), weights  # (B, Lq, d_model)

    @staticmethod
    def _project(layer: nn.Linear, x: torch.Tensor, fast: bool) -> torch.Tensor:
        """``layer(x)``; with ``fast``, the same product on oneDNN where it can (chapter 13)."""
        return fast_linear(x, layer.weight, layer.bias) if fast else layer(x)

    def _expand_kv(self, x: torch.Tensor) -> torch.Tensor:
        """One key/value head per query head: nothing to do. ``GroupedQueryAttention``
        (chapter 14) overrides this to share each key/value head among several."""
        return x

    def _fused_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         mask: torch.Tensor | None) -> torch.Tensor:
        """The same attention on PyTorch's fused kernel: ``(B, H, Lq, D)``."""
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
                      mask: torch.Tensor | None, cache: KVCache | LayerCache | None) -> None:
        check_tensor("query", query, ("B", "Lq", self.d_model))
        batch = query.size(0)
        check_tensor("key", key, (batch, "Lk", self.d_model))
        check_tensor("value", value, (batch, key.size(1), self.d_model))
        check_dtype("query", query, self.q_proj.weight.dtype, "the module's parameters")
        check_dtype("key", key, query.dtype, "the query's")
        check_dtype("value", value, query.dtype, "the query's")
        if cache is not None and not isinstance(cache, (KVCache, LayerCache)):
            raise TypeError(f"cache: expected a KVCache or one of its layers, "
                            f"got {type(cache).__name__}")
        if mask is not None:
            k_len = key.size(1) + (0 if cache is None else cache.length)
            check_mask(mask, (batch, self.num_heads, query.size(1), k_len),
                       "B H Lq Lk", query.dtype)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, num_heads={self.num_heads}, dropout={self.dropout}"
