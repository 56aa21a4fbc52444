"""Two published variants, kept with their sources' names (chapters 9 and
10).

* Dive into Deep Learning (d2l): heads folded into the batch with
  ``transpose_qkv``, masks given as ``valid_lens``; ``DotProductAttention``
  and ``D2LMultiHeadAttention``.
* The einops documentation's rewrite of the
  attention-is-all-you-need-pytorch repository: ``rearrange`` +
  ``einsum``, ``d_k != d_v`` allowed, residual + LayerNorm;
  ``EinsumMultiHeadAttention``.

Both use the library's mask convention (True = may attend) and its safe
softmax, so a query with nothing to attend to gives zeros. Where that
differs from the sources: d2l fills with minus a million and gives such a
row uniform weights; the einops example takes True = blocked.

Shape legend: B - batch, H - heads, Lq/Lk - query/key length, D - head dim.
"""

from __future__ import annotations

import math

import torch
from einops import rearrange
from torch import nn

from mha_lib._checks import (
    check_dtype,
    check_mask,
    check_module_dtype,
    check_positive_int,
    check_probability,
    check_tensor,
)
from mha_lib.attention import masked_softmax
from mha_lib.heads import transpose_output, transpose_qkv
from mha_lib.masks import padding_mask

__all__ = [
    "DotProductAttention",
    "D2LMultiHeadAttention",
    "EinsumMultiHeadAttention",
]


class DotProductAttention(nn.Module):
    """d2l's scaled dot-product attention on 3-D tensors.

    ``forward(queries (B, Lq, D), keys (B, Lk, D), values (B, Lk, Dv),
    valid_lens=None)`` returns ``(B, Lq, Dv)`` and keeps the weights in
    ``self.attention_weights``. ``valid_lens`` ``(B,)`` or ``(B, Lq)``: how
    many keys each query may see. Derived in chapter 9.

    One difference from d2l as published: a query with ``valid_lens`` 0
    gets zero weights and a zero output (the library's
    :func:`~mha_lib.masked_softmax`); d2l's ``masked_softmax`` fills with
    ``-1e6`` and gives uniform weights, the mean of the values.

    Args:
        dropout: The dropout probability on the attention weights.
    """

    def __init__(self, dropout: float):
        super().__init__()
        check_probability("dropout", dropout)
        self.dropout = nn.Dropout(dropout)
        self.attention_weights: torch.Tensor | None = None

    def forward(
        self, queries: torch.Tensor, keys: torch.Tensor,
        values: torch.Tensor, valid_lens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The attention output ``(B, Lq, Dv)``; the weights go to
        ``attention_weights``.

        Args:
            queries: ``(B, Lq, D)``.
            keys: ``(B, Lk, D)``.
            values: ``(B, Lk, Dv)``.
            valid_lens: How many keys (from the start) each sample,
                ``(B,)``, or each query, ``(B, Lq)``, may attend to; None
                lets every query see every key.
        """
        check_d2l_attention(queries, keys, values, valid_lens)
        d = queries.shape[-1]
        scores = (torch.bmm(queries, keys.transpose(1, 2))
                  / math.sqrt(d))  # (B, Lq, Lk)
        mask = None
        if valid_lens is not None:
            # (B, 1, Lk) or (B, Lq, Lk)
            mask = padding_mask(valid_lens, keys.size(1))[:, 0]
        self.attention_weights = masked_softmax(scores, mask)  # (B, Lq, Lk)
        return torch.bmm(self.dropout(self.attention_weights),
                         values)  # (B, Lq, Dv)


class D2LMultiHeadAttention(nn.Module):
    """d2l's multi-head attention: projections ``W_q, W_k, W_v, W_o``, heads
    folded into the batch dimension.

    ``forward(queries (B, Lq, query_size), keys (B, Lk, key_size),
    values (B, Lk, value_size), valid_lens)`` returns
    ``(B, Lq, num_hiddens)``; ``valid_lens`` ``(B,)``, ``(B, Lq)`` or None,
    repeated for every head. Derived in chapter 9. As in
    :class:`~mha_lib.DotProductAttention`, a query with ``valid_lens`` 0
    gets zeros where d2l as published gives uniform weights.

    Args:
        key_size: The width of the keys fed to ``W_k``.
        query_size: The width of the queries fed to ``W_q``.
        value_size: The width of the values fed to ``W_v``.
        num_hiddens: The width of the projections and of the output (d2l's
            name for ``d_model``).
        num_heads: ``H``, a divisor of ``num_hiddens``.
        dropout: The dropout probability on the attention weights.
        bias: Whether the four projections have a bias (d2l: no).

    Example:
        >>> attention = D2LMultiHeadAttention(
        ...     8, 8, 8, num_hiddens=8, num_heads=4, dropout=0.0)
        >>> x = torch.randn(2, 6, 8)  # (B, L, num_hiddens)
        >>> attention(x, x, x, valid_lens=torch.tensor([6, 3])).shape
        torch.Size([2, 6, 8])
    """

    def __init__(self, key_size: int, query_size: int, value_size: int,
                 num_hiddens: int, num_heads: int, dropout: float,
                 bias: bool = False):
        super().__init__()
        check_d2l_sizes(key_size, query_size, value_size, num_hiddens,
                        num_heads)
        self.sizes = (query_size, key_size, value_size)  # for the checks
        self.num_heads = num_heads
        self.attention = DotProductAttention(dropout)
        self.W_q = nn.Linear(query_size, num_hiddens, bias=bias)
        self.W_k = nn.Linear(key_size, num_hiddens, bias=bias)
        self.W_v = nn.Linear(value_size, num_hiddens, bias=bias)
        self.W_o = nn.Linear(num_hiddens, num_hiddens, bias=bias)

    def forward(
        self, queries: torch.Tensor, keys: torch.Tensor,
        values: torch.Tensor, valid_lens: torch.Tensor | None,
    ) -> torch.Tensor:
        """The output ``(B, Lq, num_hiddens)``.

        Args:
            queries: ``(B, Lq, query_size)``.
            keys: ``(B, Lk, key_size)``.
            values: ``(B, Lk, value_size)``.
            valid_lens: How many keys each sample, ``(B,)``, or each query,
                ``(B, Lq)``, may attend to, or None for all of them (d2l
                passes it positionally).
        """
        check_d2l_inputs(self, queries, keys, values, valid_lens)
        queries = transpose_qkv(self.W_q(queries),
                                self.num_heads)  # (B*H, Lq, D)
        keys = transpose_qkv(self.W_k(keys),
                             self.num_heads)  # (B*H, Lk, D)
        values = transpose_qkv(self.W_v(values),
                               self.num_heads)  # (B*H, Lk, D)
        if valid_lens is not None:
            # each sample's lengths, once per head:
            # (B,) -> (B*H,) or (B, Lq) -> (B*H, Lq)
            valid_lens = torch.repeat_interleave(
                valid_lens, repeats=self.num_heads, dim=0)
        output = self.attention(queries, keys, values,
                                valid_lens)  # (B*H, Lq, D)
        output_concat = transpose_output(output,
                                         self.num_heads)  # (B, Lq, H*D)
        return self.W_o(output_concat)  # (B, Lq, num_hiddens)


class EinsumMultiHeadAttention(nn.Module):
    """The einops documentation's multi-head attention (a rewrite of the
    attention-is-all-you-need-pytorch repository's): ``rearrange`` +
    ``einsum``, per-head key size ``d_k`` and value size ``d_v``, then
    ``LayerNorm(dropout(fc(heads)) + q)``.

    ``forward(q (B, Lq, d_model), k (B, Lk, d_model), v (B, Lk, d_model),
    mask=None)`` returns ``(output (B, Lq, d_model), attn (H, B, Lq, Lk))``:
    the example's head-first layout. ``mask`` follows the library (True =
    may attend; the example's is the opposite): ``(B, Lq, Lk)`` or
    ``(Lq, Lk)`` is shared by all heads, as in the example; a 4-D mask is
    read as ``(B, H, Lq, Lk)``. Derived in chapter 10.

    Args:
        n_head: ``H``, the number of heads.
        d_model: The width of the inputs and of the output.
        d_k: The width of one head's queries and keys.
        d_v: The width of one head's values.
        dropout: The dropout probability after the output projection
            ``fc``.

    Example:
        >>> attention = EinsumMultiHeadAttention(
        ...     n_head=4, d_model=8, d_k=3, d_v=5, dropout=0.0)
        >>> x = torch.randn(2, 6, 8)  # (B, L, d_model)
        >>> out, attn = attention(x, x, x, mask=causal_mask(6))
        >>> out.shape, attn.shape  # (B, L, d_model), (H, B, Lq, Lk)
        (torch.Size([2, 6, 8]), torch.Size([4, 2, 6, 6]))
    """

    def __init__(self, n_head: int, d_model: int, d_k: int, d_v: int,
                 dropout: float = 0.1):
        super().__init__()
        check_einsum_sizes(n_head, d_model, d_k, d_v, dropout)
        self.n_head = n_head
        self.d_model = d_model  # for the checks
        self.w_qs = nn.Linear(d_model, n_head * d_k)
        self.w_ks = nn.Linear(d_model, n_head * d_k)
        self.w_vs = nn.Linear(d_model, n_head * d_v)
        nn.init.normal_(self.w_qs.weight, mean=0,
                        std=math.sqrt(2.0 / (d_model + d_k)))
        nn.init.normal_(self.w_ks.weight, mean=0,
                        std=math.sqrt(2.0 / (d_model + d_k)))
        nn.init.normal_(self.w_vs.weight, mean=0,
                        std=math.sqrt(2.0 / (d_model + d_v)))
        self.fc = nn.Linear(n_head * d_v, d_model)
        nn.init.xavier_normal_(self.fc.weight)
        self.dropout = nn.Dropout(p=dropout)
        self.layer_norm = nn.LayerNorm(d_model)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(output (B, Lq, d_model), attn (H, B, Lq, Lk))``.

        Args:
            q: Queries ``(B, Lq, d_model)``, also the residual added before
                the LayerNorm.
            k: Keys ``(B, Lk, d_model)``.
            v: Values ``(B, Lk, d_model)``.
            mask: Bool (True = may attend) or float (added to the scores),
                ``(Lq, Lk)``, ``(B, Lq, Lk)`` or ``(B, H, Lq, Lk)``; None
                attends everywhere.
        """
        check_einsum_inputs(self, q, k, v, mask)
        residual = q
        q = rearrange(self.w_qs(q), "b l (head k) -> head b l k",
                      head=self.n_head)
        k = rearrange(self.w_ks(k), "b t (head k) -> head b t k",
                      head=self.n_head)
        v = rearrange(self.w_vs(v), "b t (head v) -> head b t v",
                      head=self.n_head)
        attn = (torch.einsum("hblk,hbtk->hblt", q, k)
                / math.sqrt(q.shape[-1]))  # (H, B, Lq, Lk)
        attn = masked_softmax(attn, heads_first(mask))  # (H, B, Lq, Lk)
        output = torch.einsum("hblt,hbtv->hblv", attn, v)  # (H, B, Lq, d_v)
        output = rearrange(output,
                           "head b l v -> b l (head v)")  # (B, Lq, H*d_v)
        output = self.dropout(self.fc(output))  # (B, Lq, d_model)
        output = self.layer_norm(output + residual)
        return output, attn


def heads_first(mask: torch.Tensor | None) -> torch.Tensor | None:
    """An einsum-variant mask in the scores' head-first layout: a 4-D
    ``(B, H, Lq, Lk)`` mask becomes ``(H, B, Lq, Lk)``; a mask without a
    head axis, ``(B, Lq, Lk)`` or ``(Lq, Lk)``, serves every head."""
    if mask is None:
        return None
    return mask.transpose(0, 1) if mask.dim() == 4 else mask[None]


# --- the input checks, one call per method ------------------------------


def check_d2l_attention(queries: torch.Tensor, keys: torch.Tensor,
                        values: torch.Tensor,
                        valid_lens: torch.Tensor | None) -> None:
    """``DotProductAttention.forward``'s inputs."""
    check_tensor("queries", queries, ("B", "Lq", "D"))
    batch, q_len, d = queries.shape
    check_tensor("keys", keys, (batch, "Lk", d))
    check_tensor("values", values, (batch, keys.size(1), "Dv"))
    check_dtype("keys", keys, queries.dtype, "the queries'")
    check_dtype("values", values, queries.dtype, "the queries'")
    _check_valid_lens(valid_lens, batch, q_len)


def check_d2l_sizes(key_size: int, query_size: int, value_size: int,
                    num_hiddens: int, num_heads: int) -> None:
    """``D2LMultiHeadAttention``'s sizes (its dropout is
    ``DotProductAttention``'s to check)."""
    for name, size in (("key_size", key_size), ("query_size", query_size),
                       ("value_size", value_size),
                       ("num_hiddens", num_hiddens)):
        check_positive_int(name, size)
    check_positive_int("num_heads", num_heads)
    if num_hiddens % num_heads:
        raise ValueError(
            f"num_heads: expected a divisor of "
            f"num_hiddens={num_hiddens}, got num_heads={num_heads}")


def check_d2l_inputs(module: D2LMultiHeadAttention, queries: torch.Tensor,
                     keys: torch.Tensor, values: torch.Tensor,
                     valid_lens: torch.Tensor | None) -> None:
    """``D2LMultiHeadAttention.forward``'s inputs."""
    query_size, key_size, value_size = module.sizes
    check_tensor("queries", queries, ("B", "Lq", query_size))
    batch = queries.size(0)
    check_tensor("keys", keys, (batch, "Lk", key_size))
    check_tensor("values", values, (batch, keys.size(1), value_size))
    for name, x in (("queries", queries), ("keys", keys),
                    ("values", values)):
        check_module_dtype(name, x, module)
    # transpose_output, as d2l wrote it, cannot unfold no rows
    if queries.numel() == 0:
        raise ValueError(
            f"queries: expected at least one sample and one query, "
            f"got shape {tuple(queries.shape)}")
    _check_valid_lens(valid_lens, batch, queries.size(1))


def _check_valid_lens(
    valid_lens: torch.Tensor | None, batch: int, q_len: int
) -> None:
    if valid_lens is None:
        return
    if not isinstance(valid_lens, torch.Tensor):
        raise TypeError(
            f"valid_lens: expected a tensor of shape ({batch},) or "
            f"({batch}, {q_len}), got {type(valid_lens).__name__}")
    if tuple(valid_lens.shape) not in ((batch,), (batch, q_len)):
        raise ValueError(
            f"valid_lens: expected shape ({batch},) or ({batch}, {q_len}) "
            f"(batch, or batch x queries), got {tuple(valid_lens.shape)}")


def check_einsum_sizes(n_head: int, d_model: int, d_k: int, d_v: int,
                       dropout: float) -> None:
    """``EinsumMultiHeadAttention``'s arguments."""
    for name, value in (("n_head", n_head), ("d_model", d_model),
                        ("d_k", d_k), ("d_v", d_v)):
        check_positive_int(name, value)
    check_probability("dropout", dropout)


def check_einsum_inputs(module: EinsumMultiHeadAttention, q: torch.Tensor,
                        k: torch.Tensor, v: torch.Tensor,
                        mask: torch.Tensor | None) -> None:
    """``EinsumMultiHeadAttention.forward``'s inputs: shapes, the module's
    dtype, and a mask that broadcasts to ``(B, Lq, Lk)`` (shared by the
    heads) or, 4-D, to ``(B, H, Lq, Lk)``."""
    check_tensor("q", q, ("B", "Lq", module.d_model))
    batch, q_len = q.shape[:2]
    check_tensor("k", k, (batch, "Lk", module.d_model))
    check_tensor("v", v, (batch, k.size(1), module.d_model))
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_module_dtype(name, x, module)
    if mask is None:
        return
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask: expected a bool or float tensor, "
                        f"got {type(mask).__name__}")
    if mask.dim() == 4:
        check_mask(mask, (batch, module.n_head, q_len, k.size(1)),
                   "B H Lq Lk", q.dtype)
    else:
        check_mask(mask, (batch, q_len, k.size(1)), "B Lq Lk", q.dtype)
