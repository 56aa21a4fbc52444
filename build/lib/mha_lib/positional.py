"""Sinusoidal positional encoding (chapter 3).

Shape legend: B - batch, L - length, d_model - model width.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from mha_lib._checks import (
    check_positive_int,
    check_probability,
    check_tensor,
)

__all__ = ["sinusoidal_encoding", "PositionalEncoding"]


def sinusoidal_encoding(length: int, d_model: int) -> torch.Tensor:
    """The table ``PE[pos, 2i] = sin(pos / 10000^(2i/d_model))``,
    ``PE[pos, 2i+1] = cos(pos / 10000^(2i/d_model))``: shape
    ``(length, d_model)``.

    Computed as the running example's ``PositionalEncoding`` (Phillips'
    article) does, ``exp`` of a ``log``, so the numbers match it bit for
    bit. Derived in chapter 3.

    Args:
        length: The number of positions (rows).
        d_model: The width of each encoding (columns); even, one sin/cos
            pair per frequency.
    """
    check_positive_int("length", length)
    check_positive_int("d_model", d_model)
    if d_model % 2:
        raise ValueError(
            f"d_model: expected an even number (sin and cos pairs), "
            f"got {d_model}")
    pe = torch.zeros(length, d_model)
    position = torch.arange(0, length).unsqueeze(1)  # (L, 1)
    div_term = torch.exp(
        torch.arange(0, d_model, 2) * -(math.log(10000.0) / d_model))
    pe[:, 0::2] = torch.sin(position * div_term)  # (L, d_model/2)
    pe[:, 1::2] = torch.cos(position * div_term)  # (L, d_model/2)
    return pe


class PositionalEncoding(nn.Module):
    """Add the sinusoidal table to embeddings ``(B, L, d_model)``, then
    dropout.

    The table is a buffer ``pe`` of shape ``(1, max_len, d_model)`` (saved,
    not trained). Derived in chapter 3.

    Args:
        d_model: The width of the embeddings it is added to.
        dropout: The dropout probability applied after the addition.
        max_len: The longest sequence it can encode (rows of the table).

    Example:
        >>> pe = PositionalEncoding(d_model=8, dropout=0.0)
        >>> y = pe(torch.zeros(2, 5, 8))  # (B, L, d_model)
        >>> y.shape, torch.equal(y[0], sinusoidal_encoding(5, 8))
        (torch.Size([2, 5, 8]), True)
    """

    def __init__(
        self, d_model: int, dropout: float = 0.1, max_len: int = 5000
    ):
        super().__init__()
        check_positive_int("max_len", max_len)
        check_probability("dropout", dropout)
        self.d_model = d_model
        self.max_len = max_len
        self.dropout = nn.Dropout(p=dropout)
        self.register_buffer(
            "pe", sinusoidal_encoding(max_len, d_model).unsqueeze(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x + pe[:L]``, then dropout: same shape as ``x``.

        Args:
            x: Embeddings ``(B, L, d_model)`` with ``L <= max_len``.
        """
        check_tensor("x", x, ("B", "L", self.d_model))
        if x.size(1) > self.max_len:
            raise ValueError(
                f"x: expected a sequence of at most max_len={self.max_len} "
                f"positions, got length {x.size(1)} "
                f"(shape {tuple(x.shape)})")
        return self.dropout(x + self.pe[:, : x.size(1)])  # (B, L, d_model)
