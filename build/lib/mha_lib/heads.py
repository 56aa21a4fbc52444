"""Reshapes between one wide vector per token and one narrow vector per head
(chapters 5, 9).

Shape legend: B - batch, L - length, H - heads, D - head dim
(d_model = H * D).
"""

from __future__ import annotations

import torch

from mha_lib._checks import check_positive_int, check_tensor

__all__ = [
    "split_heads", "merge_heads", "transpose_qkv", "transpose_output",
]


def _check_heads(name: str, x: torch.Tensor, num_heads: int) -> None:
    check_positive_int("num_heads", num_heads)
    if x.size(-1) % num_heads:
        raise ValueError(
            f"{name}: expected a last dimension divisible by "
            f"num_heads={num_heads}, got shape {tuple(x.shape)}")


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """``(B, L, H*D)`` -> ``(B, H, L, D)``: view the features as heads, then
    bring the head axis before the length axis. Derived in chapter 5.

    Args:
        x: Queries, keys or values ``(B, L, d_model)``.
        num_heads: ``H``, a divisor of ``d_model``; each head gets
            ``D = d_model / H`` features.

    Example:
        >>> x = torch.randn(2, 5, 8)  # (B, L, d_model)
        >>> heads = split_heads(x, num_heads=4)
        >>> heads.shape  # (B, H, L, D)
        torch.Size([2, 4, 5, 2])
        >>> torch.equal(merge_heads(heads), x)
        True
    """
    check_tensor("x", x, ("B", "L", "d_model"), floating=False)
    _check_heads("x", x, num_heads)
    batch, length, d_model = x.shape
    x = x.reshape(batch, length, num_heads,
                  d_model // num_heads)  # (B, L, H, D); a view
    return x.transpose(1, 2)  # (B, H, L, D)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """``(B, H, L, D)`` -> ``(B, L, H*D)``: the inverse of
    :func:`split_heads` (concatenate the heads). Derived in chapter 5, used
    in chapter 8.

    Args:
        x: One tensor per head, ``(B, H, L, D)``.
    """
    check_tensor("x", x, ("B", "H", "L", "D"), floating=False)
    batch, num_heads, length, head_dim = x.shape
    x = x.transpose(1, 2)  # (B, L, H, D)
    return x.reshape(batch, length, num_heads * head_dim)  # (B, L, H*D)


def transpose_qkv(X: torch.Tensor, num_heads: int) -> torch.Tensor:
    """d2l's ``(B, L, H*D)`` -> ``(B*H, L, D)``: heads folded into the
    batch, so a batched matmul attends every head at once. Derived in
    chapter 9.

    Args:
        X: Queries, keys or values ``(B, L, num_hiddens)`` (d2l's names).
        num_heads: ``H``, a divisor of ``num_hiddens``.
    """
    check_tensor("X", X, ("B", "L", "num_hiddens"), floating=False)
    _check_heads("X", X, num_heads)
    X = X.reshape(X.shape[0], X.shape[1], num_heads,
                  X.shape[2] // num_heads)  # (B, L, H, D)
    X = X.permute(0, 2, 1, 3)  # (B, H, L, D)
    return X.reshape(X.shape[0] * num_heads,
                     X.shape[2], X.shape[3])  # (B*H, L, D)


def transpose_output(X: torch.Tensor, num_heads: int) -> torch.Tensor:
    """d2l's ``(B*H, L, D)`` -> ``(B, L, H*D)``: the inverse of
    :func:`transpose_qkv`. Derived in chapter 9.

    Args:
        X: The heads folded into the batch, ``(B*H, L, D)``.
        num_heads: ``H``, a divisor of ``X.shape[0]``.
    """
    check_tensor("X", X, ("B*H", "L", "D"), floating=False)
    check_positive_int("num_heads", num_heads)
    if X.shape[0] % num_heads:
        raise ValueError(
            f"X: expected a first dimension B*H divisible by "
            f"num_heads={num_heads}, got shape {tuple(X.shape)}")
    # reshape(-1, ...) (d2l's code, chapter 9) cannot infer B from no data
    if X.numel() == 0:
        raise ValueError(
            f"X: expected a non-empty (B*H, L, D) tensor, "
            f"got shape {tuple(X.shape)}")
    X = X.reshape(-1, num_heads, X.shape[1], X.shape[2])  # (B, H, L, D)
    X = X.permute(0, 2, 1, 3)  # (B, L, H, D)
    return X.reshape(X.shape[0], X.shape[1], -1)  # (B, L, H*D)
