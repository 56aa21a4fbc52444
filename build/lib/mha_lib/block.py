"""The transformer block: attention and a feed-forward network, each in a
residual connection with a LayerNorm (chapter 12).

Shape legend: B - batch, L - length (new tokens), H - heads, Lk - key
length (cached + new), d_ff - width of the feed-forward network's hidden
layer.
"""

from __future__ import annotations

import torch
from torch import nn

from mha_lib._checks import (
    check_module_dtype,
    check_positive_int,
    check_tensor,
)
from mha_lib.cache import KVCache, LayerCache
from mha_lib.gqa import GroupedQueryAttention
from mha_lib.mha import MultiHeadAttention

__all__ = ["TransformerBlock"]

ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU}


class TransformerBlock(nn.Module):
    """Self-attention and a position-wise feed-forward network, each added
    back to its input (a residual connection) and each with a LayerNorm.

    Pre-norm (``norm_first=True``, GPT-2 and most models since)::

        x = x + dropout1(attn(norm1(x)))
        x = x + dropout2(feed_forward(norm2(x)))

    Post-norm (``norm_first=False``, the original transformer)::

        x = norm1(x + dropout1(attn(x)))
        x = norm2(x + dropout2(feed_forward(x)))

    ``feed_forward(x) = linear2(ffn_dropout(activation(linear1(x))))``.
    The submodules are ``attn`` (a :class:`~mha_lib.MultiHeadAttention`,
    or a :class:`~mha_lib.GroupedQueryAttention` with ``num_kv_heads``),
    ``norm1``, ``norm2`` (``nn.LayerNorm``), ``linear1``, ``linear2``
    (``nn.Linear``), ``activation`` and the ``nn.Dropout`` modules
    ``dropout1``, ``ffn_dropout`` and ``dropout2``; :meth:`forward` calls
    them, never their weights. Input and output are ``(B, L, d_model)``.
    Given the same weights it computes what
    ``nn.TransformerEncoderLayer(batch_first=True)`` computes
    (:func:`~mha_lib.to_torch_encoder_layer`). Derived in chapter 12.

    Args:
        d_model: Width of every token vector.
        num_heads: Number of attention heads; must divide ``d_model``.
        d_ff: Width of the feed-forward network's hidden layer (often
            ``4 * d_model``).
        dropout: Probability of each dropout: on the attention weights,
            on the attention output, on the hidden layer and on the output
            of the feed-forward network.
        norm_first: True for pre-norm, False for post-norm.
        activation: ``"gelu"`` or ``"relu"``, between the two linear
            layers.
        num_kv_heads: Key/value heads for grouped-query attention
            (chapter 14); None for one per query head.

    Example:
        >>> block = TransformerBlock(d_model=8, num_heads=4, d_ff=32)
        >>> y, _ = block(torch.randn(2, 6, 8), is_causal=True)
        >>> y.shape
        torch.Size([2, 6, 8])
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int,
                 dropout: float = 0.0, norm_first: bool = True,
                 activation: str = "gelu", *,
                 num_kv_heads: int | None = None):
        super().__init__()
        check_positive_int("d_ff", d_ff)
        if not isinstance(norm_first, bool):
            raise TypeError(f"norm_first: expected a bool, "
                            f"got {norm_first!r}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation: expected one of "
                             f"{sorted(ACTIVATIONS)}, got {activation!r}")
        if num_kv_heads is None:
            self.attn = MultiHeadAttention(d_model, num_heads, dropout)
        else:
            self.attn = GroupedQueryAttention(d_model, num_heads,
                                              num_kv_heads, dropout)
        self.d_model, self.d_ff = d_model, d_ff
        self.norm_first = norm_first
        self.linear1 = nn.Linear(d_model, d_ff)
        self.activation = ACTIVATIONS[activation]()
        self.ffn_dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        need_weights: bool = False,
        *,
        is_causal: bool = False,
        cache: KVCache | LayerCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Returns ``(output (B, L, d_model), weights (B, H, L, Lk) or
        None)``.

        Args:
            x: ``(B, L, d_model)``.
            mask: The attention mask, as for
                :class:`~mha_lib.MultiHeadAttention`: bool (True = may
                attend) or float (added to the scores), ``(L, Lk)`` or
                ``(B|1, H|1, L, Lk)``.
            need_weights: True runs attention's explicit path and returns
                its weights; False its fused path, and None for them.
            is_causal: Each token attends only to itself and the tokens
                before it (combined with ``mask`` if both are given).
            cache: One layer of a :class:`~mha_lib.KVCache`, for decoding
                (chapter 14).
        """
        check_tensor("x", x, ("B", "L", self.d_model))
        check_module_dtype("x", x, self)
        if self.norm_first:  # pre-norm: x + f(LN(x))
            attended, weights = self.attn(
                self.norm1(x), mask=mask, need_weights=need_weights,
                is_causal=is_causal, cache=cache)  # (B, L, d_model)
            x = x + self.dropout1(attended)
            x = x + self.dropout2(self.feed_forward(self.norm2(x)))
        else:  # post-norm: LN(x + f(x))
            attended, weights = self.attn(
                x, mask=mask, need_weights=need_weights,
                is_causal=is_causal, cache=cache)  # (B, L, d_model)
            x = self.norm1(x + self.dropout1(attended))
            x = self.norm2(x + self.dropout2(self.feed_forward(x)))
        return x, weights  # (B, L, d_model), (B, H, L, Lk) or None

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The position-wise feed-forward network, ``(..., d_model)`` to
        ``(..., d_model)`` through a hidden layer of width ``d_ff``.

        Args:
            x: ``(..., d_model)``; every position is transformed alone.
        """
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x: expected a torch.Tensor of shape "
                            f"(..., {self.d_model}), "
                            f"got {type(x).__name__}")
        if x.dim() == 0 or x.size(-1) != self.d_model:
            raise ValueError(f"x: expected shape (..., {self.d_model}), "
                             f"got {tuple(x.shape)}")
        hidden = self.activation(self.linear1(x))  # (..., d_ff)
        return self.linear2(self.ffn_dropout(hidden))  # (..., d_model)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, d_ff={self.d_ff}, "
                f"norm_first={self.norm_first}")
