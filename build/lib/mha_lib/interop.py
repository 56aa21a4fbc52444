"""Weights in and out of ``torch.nn.MultiheadAttention`` (chapter 11) and
``torch.nn.TransformerEncoderLayer`` (chapter 12).

Mind the masks: ``nn.MultiheadAttention`` reads a bool ``attn_mask`` or
``key_padding_mask`` as True = **blocked**, the opposite of ``mha_lib``
(True = may attend). Pass ``~mask``. Its ``key_padding_mask`` is
``(B, Lk)``. ``nn.TransformerEncoderLayer`` passes its ``src_mask`` and
``src_key_padding_mask`` on to it: the same rule.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mha_lib.block import TransformerBlock
from mha_lib.mha import MultiHeadAttention

__all__ = ["to_torch_mha", "from_torch_mha", "to_torch_encoder_layer",
           "from_torch_encoder_layer"]


def to_torch_mha(m: MultiHeadAttention) -> nn.MultiheadAttention:
    """An ``nn.MultiheadAttention(batch_first=True)`` with ``m``'s weights,
    dropout, device, dtype and train/eval mode. Derived in chapter 11.

    Args:
        m: The module to copy (one key/value head per query head).

    Example:
        >>> mha = MultiHeadAttention(8, 4).eval()
        >>> torch_mha = to_torch_mha(mha)  # batch_first=True
        >>> x = torch.randn(2, 6, 8)
        >>> m = padding_mask(torch.tensor([6, 3]))  # True = may attend
        >>> ours, _ = mha(x, mask=m)
        >>> theirs, _ = torch_mha(x, x, x, key_padding_mask=~m[:, 0, 0])
        >>> torch.allclose(ours, theirs, atol=1e-6)
        True
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


def _activation_name(activation: object) -> str | None:
    """"relu" or "gelu" for the activations both sides share, else None."""
    if activation is F.relu or type(activation) is nn.ReLU:
        return "relu"
    if activation is F.gelu or (type(activation) is nn.GELU
                                and activation.approximate == "none"):
        return "gelu"
    return None


def to_torch_encoder_layer(block: TransformerBlock
                           ) -> nn.TransformerEncoderLayer:
    """An ``nn.TransformerEncoderLayer(batch_first=True)`` with ``block``'s
    weights, ``norm_first``, activation, dropout, LayerNorm epsilon,
    device, dtype and train/eval mode. Derived in chapter 12.

    The layer's bool masks mean the opposite of the block's: pass
    ``src_mask=~mask`` for an ``(L, L)`` mask and
    ``src_key_padding_mask=~valid`` for a ``(B, L)`` one.

    Args:
        block: The block to copy: multi-head attention (one key/value head
            per query head), ``nn.ReLU`` or exact ``nn.GELU``, biases and
            LayerNorms as :class:`~mha_lib.TransformerBlock` makes them.
    """
    if not isinstance(block, TransformerBlock):
        raise TypeError(f"block: expected a mha_lib.TransformerBlock, "
                        f"got {type(block).__name__}")
    if not isinstance(block.attn, MultiHeadAttention) \
            or block.attn.num_kv_heads != block.attn.num_heads:
        raise ValueError(
            f"block: expected attention with one key/value head per "
            f"query head (nn.TransformerEncoderLayer has no grouped-query "
            f"form), got {block.attn!r}")
    if any(getattr(block.attn, name).bias is None
           for name in ("q_proj", "k_proj", "v_proj", "out_proj")):
        raise ValueError(
            "block: expected attention with biases (the layer has bias "
            "in every linear layer or in none, LayerNorms included), got "
            "attention layers without bias")
    activation = _activation_name(block.activation)
    if activation is None:
        raise ValueError(
            f"block: expected activation nn.ReLU() or nn.GELU() (the "
            f"ones nn.TransformerEncoderLayer runs on every path), got "
            f"{block.activation!r}")
    p = _same_dropout("block", {
        "attn.attn_dropout": _p(block.attn.attn_dropout),
        "dropout1": _p(block.dropout1),
        "ffn_dropout": _p(block.ffn_dropout),
        "dropout2": _p(block.dropout2)})
    eps = _layer_norm_eps("block", block.norm1, block.norm2)
    _check_linear("block", block.linear1, block.linear2)
    weight = block.linear1.weight
    t = nn.TransformerEncoderLayer(
        block.d_model, block.attn.num_heads,
        dim_feedforward=block.linear1.out_features, dropout=p,
        activation=activation, layer_norm_eps=eps, batch_first=True,
        norm_first=block.norm_first, device=weight.device,
        dtype=weight.dtype)
    attn = to_torch_mha(block.attn)
    with torch.no_grad():
        t.self_attn.load_state_dict(attn.state_dict())
        for name in ("linear1", "linear2", "norm1", "norm2"):
            getattr(t, name).load_state_dict(
                getattr(block, name).state_dict())
    return t.train(block.training)


def from_torch_encoder_layer(layer: nn.TransformerEncoderLayer
                             ) -> TransformerBlock:
    """A :class:`~mha_lib.TransformerBlock` with ``layer``'s weights (the
    inverse of :func:`to_torch_encoder_layer`). ``layer`` may be batch
    first or not: weights do not care, but the returned block always takes
    batch-first input. Derived in chapter 12.

    Args:
        layer: The PyTorch layer to copy, with ``bias=True``, activation
            ``"relu"`` or ``"gelu"`` (or ``F.relu``, ``F.gelu``,
            ``nn.ReLU()``, exact ``nn.GELU()``), one dropout probability
            and one LayerNorm epsilon.
    """
    if not isinstance(layer, nn.TransformerEncoderLayer):
        raise TypeError(f"layer: expected a "
                        f"torch.nn.TransformerEncoderLayer, "
                        f"got {type(layer).__name__}")
    activation = _activation_name(layer.activation)
    if activation is None:
        raise ValueError(
            f"layer: expected activation 'relu' or 'gelu' (F.relu, "
            f"F.gelu, nn.ReLU() or nn.GELU() with approximate='none'), "
            f"got {layer.activation!r}")
    attn = layer.self_attn
    if not isinstance(attn, nn.MultiheadAttention):
        raise TypeError(f"layer: expected self_attn to be a "
                        f"torch.nn.MultiheadAttention, "
                        f"got {type(attn).__name__}")
    if attn.in_proj_bias is None or attn.out_proj.bias is None:
        raise ValueError(
            "layer: expected bias=True (TransformerBlock has biases in "
            "every linear layer and LayerNorm), got a layer without "
            "attention biases")
    if not attn._qkv_same_embed_dim or attn.bias_k is not None \
            or attn.add_zero_attn:
        raise ValueError(
            "layer: expected self_attn with kdim == vdim == d_model and "
            "without add_bias_kv or add_zero_attn, got one that has them")
    p = _same_dropout("layer", {
        "self_attn.dropout": attn.dropout,
        "dropout1": _p(layer.dropout1), "dropout": _p(layer.dropout),
        "dropout2": _p(layer.dropout2)})
    eps = _layer_norm_eps("layer", layer.norm1, layer.norm2)
    _check_linear("layer", layer.linear1, layer.linear2)
    weight = layer.linear1.weight
    block = TransformerBlock(attn.embed_dim, attn.num_heads,
                             layer.linear1.out_features, dropout=p,
                             norm_first=layer.norm_first,
                             activation=activation)
    block = block.to(device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        block.attn.load_state_dict(from_torch_mha(attn).state_dict())
        for name in ("linear1", "linear2", "norm1", "norm2"):
            getattr(block, name).load_state_dict(
                getattr(layer, name).state_dict())
    for norm in (block.norm1, block.norm2):
        norm.eps = eps
    return block.train(layer.training)


def _p(module: nn.Module) -> float | None:
    """A dropout module's probability; None if it is no ``nn.Dropout``."""
    return module.p if isinstance(module, nn.Dropout) else None


def _same_dropout(arg: str, probabilities: dict[str, float | None]
                  ) -> float:
    """The one dropout probability of every dropout of a block or
    layer."""
    values = set(probabilities.values())
    if None in values or len(values) != 1:
        given = ", ".join(
            f"{name}={'not nn.Dropout' if p is None else p}"
            for name, p in probabilities.items())
        raise ValueError(
            f"{arg}: expected nn.Dropout modules with one probability "
            f"(the layer has one dropout argument), got {given}")
    return values.pop()


def _layer_norm_eps(arg: str, norm1: nn.Module, norm2: nn.Module
                    ) -> float:
    """The one epsilon of two affine ``nn.LayerNorm`` with biases."""
    for name, norm in (("norm1", norm1), ("norm2", norm2)):
        if not isinstance(norm, nn.LayerNorm) or norm.weight is None \
                or norm.bias is None:
            raise ValueError(
                f"{arg}: expected {name} to be an nn.LayerNorm with a "
                f"weight and a bias, got {norm!r}")
    if norm1.eps != norm2.eps:
        raise ValueError(
            f"{arg}: expected one LayerNorm epsilon (the layer has one "
            f"layer_norm_eps), got norm1.eps={norm1.eps}, "
            f"norm2.eps={norm2.eps}")
    return norm1.eps


def _check_linear(arg: str, linear1: nn.Module, linear2: nn.Module
                  ) -> None:
    for name, linear in (("linear1", linear1), ("linear2", linear2)):
        if not isinstance(linear, nn.Linear) or linear.bias is None:
            raise ValueError(
                f"{arg}: expected {name} to be an nn.Linear with a bias "
                f"(bias=True), got {linear!r}")
