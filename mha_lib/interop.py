"""Weights in and out of ``torch.nn.MultiheadAttention`` (chapter 11).

Mind the masks: ``nn.MultiheadAttention`` reads a bool ``attn_mask`` or
``key_padding_mask`` as True = **blocked**, the opposite of ``mha_lib``
(True = may attend). Pass ``~mask``. Its ``key_padding_mask`` is
``(B, Lk)``.
"""

from __future__ import annotations

import torch
from torch import nn

from mha_lib.mha import MultiHeadAttention

__all__ = ["to_torch_mha", "from_torch_mha"]


def to_torch_mha(m: MultiHeadAttention) -> nn.MultiheadAttention:
    """An ``nn.MultiheadAttention(batch_first=True)`` with ``m``'s weights,
    dropout, device, dtype and train/eval mode. Derived in chapter 11.

    Args:
        m: The module to copy (one key/value head per query head).
    """
    if not isinstance(m, MultiHeadAttention):
        raise TypeError(
            f"m: expected a mha_lib.MultiHeadAttention, "
            f"got {type(m).__name__}")
    if m.num_kv_heads != m.num_heads:
        raise ValueError(
            f"m: expected one key/value head per query head "
            f"(nn.MultiheadAttention has no grouped-query form), "
            f"got num_kv_heads={m.num_kv_heads} "
            f"for num_heads={m.num_heads}")
    weight = m.q_proj.weight
    t = nn.MultiheadAttention(m.d_model, m.num_heads, dropout=m.dropout,
                              bias=m.q_proj.bias is not None,
                              batch_first=True, device=weight.device,
                              dtype=weight.dtype)
    with torch.no_grad():
        # nn.MultiheadAttention keeps the three input projections
        # stacked: [W_q; W_k; W_v]
        t.in_proj_weight.copy_(torch.cat(
            [m.q_proj.weight, m.k_proj.weight, m.v_proj.weight]))
        t.out_proj.weight.copy_(m.out_proj.weight)
        if m.q_proj.bias is not None:
            t.in_proj_bias.copy_(torch.cat(
                [m.q_proj.bias, m.k_proj.bias, m.v_proj.bias]))
            t.out_proj.bias.copy_(m.out_proj.bias)
    return t.train(m.training)


def from_torch_mha(t: nn.MultiheadAttention) -> MultiHeadAttention:
    """A :class:`MultiHeadAttention` with ``t``'s weights (the inverse of
    :func:`to_torch_mha`). ``t`` may be batch first or not: weights do not
    care, but the returned module always takes batch-first input. Derived in
    chapter 11.

    Args:
        t: The PyTorch module to copy, with ``kdim == vdim == embed_dim``
            and without ``add_bias_kv`` or ``add_zero_attn``.
    """
    if not isinstance(t, nn.MultiheadAttention):
        raise TypeError(
            f"t: expected a torch.nn.MultiheadAttention, "
            f"got {type(t).__name__}")
    if not t._qkv_same_embed_dim:
        raise ValueError(
            f"t: expected kdim == vdim == embed_dim={t.embed_dim}, "
            f"got kdim={t.kdim}, vdim={t.vdim}")
    if t.bias_k is not None or t.add_zero_attn:
        raise ValueError(
            "t: expected add_bias_kv=False and add_zero_attn=False, "
            "got a module that uses them (mha_lib has no such keys)")
    has_bias = t.in_proj_bias is not None
    if has_bias != (t.out_proj.bias is not None):
        raise ValueError(
            "t: expected biases on both or neither of the input and output "
            "projections, got only one")
    weight = t.in_proj_weight
    m = MultiHeadAttention(t.embed_dim, t.num_heads, dropout=t.dropout,
                           bias=has_bias)
    m = m.to(device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        for proj, w in zip((m.q_proj, m.k_proj, m.v_proj),
                           t.in_proj_weight.chunk(3), strict=True):
            proj.weight.copy_(w)
        m.out_proj.weight.copy_(t.out_proj.weight)
        if has_bias:
            for proj, b in zip((m.q_proj, m.k_proj, m.v_proj),
                               t.in_proj_bias.chunk(3), strict=True):
                proj.bias.copy_(b)
            m.out_proj.bias.copy_(t.out_proj.bias)
    return m.train(t.training)
