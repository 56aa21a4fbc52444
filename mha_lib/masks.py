"""Attention masks, one convention: a bool tensor, True = may attend
(chapter 7).

This is the convention of
``torch.nn.functional.scaled_dot_product_attention``.
``torch.nn.MultiheadAttention`` uses the opposite (True = blocked): see
Appendix A.

Shapes use the book's letters: ``B`` batch, ``H`` heads, ``Lq`` query
length, ``Lk`` key length.
"""

from __future__ import annotations

import torch

__all__ = ["causal_mask", "padding_mask", "sliding_window_mask"]


def _check_lengths(**lengths: object) -> None:
    for name, value in lengths.items():
        if (isinstance(value, bool) or not isinstance(value, int)
                or value < 0):
            raise ValueError(
                f"{name}: expected a non-negative int, got {value!r}")


def _check_whole(valid_lens: torch.Tensor) -> None:
    """Float lengths must be whole numbers (not NaN, inf or 2.5)."""
    if not valid_lens.is_floating_point():
        return
    whole = valid_lens.isfinite() & (valid_lens == valid_lens.floor())
    if not bool(whole.all()):
        raise ValueError(
            f"valid_lens: expected whole numbers of keys, got a length of "
            f"{valid_lens[~whole][0].item()}")


def causal_mask(q_len: int, k_len: int | None = None,
                device: torch.device | str | None = None) -> torch.Tensor:
    """``(Lq, Lk)`` bool mask where query ``i`` may attend key ``j`` iff
    ``j <= i + Lk - Lq``.

    With ``Lq == Lk`` (the default) this is the lower triangle: no token
    sees its future. With ``Lk > Lq`` the queries are the last ``Lq``
    positions (decoding with a KV cache). Derived in chapter 7.

    Args:
        q_len: The number of queries ``Lq``.
        k_len: The number of keys ``Lk``; defaults to ``q_len``.
        device: Where to create the mask (default: PyTorch's default
            device).

    Example:
        >>> causal_mask(3).int()
        tensor([[1, 0, 0],
                [1, 1, 0],
                [1, 1, 1]], dtype=torch.int32)
        >>> causal_mask(2, 4).int()  # 2 new queries after 2 cached keys
        tensor([[1, 1, 1, 0],
                [1, 1, 1, 1]], dtype=torch.int32)
    """
    k_len = q_len if k_len is None else k_len
    _check_lengths(q_len=q_len, k_len=k_len)
    ones = torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    return torch.tril(ones, diagonal=k_len - q_len)  # (Lq, Lk)


def sliding_window_mask(q_len: int, window: int, k_len: int | None = None,
                        device: torch.device | str | None = None
                        ) -> torch.Tensor:
    """``(Lq, Lk)`` bool mask where each query attends itself and the
    ``window - 1`` keys before it.

    Query ``i`` is position ``p = i + Lk - Lq`` (aligned bottom-right, like
    :func:`causal_mask`) and may attend key ``j`` iff
    ``p - window < j <= p``. ``window >= Lk`` gives the causal mask.
    Derived in chapter 17.

    Args:
        q_len: The number of queries ``Lq``.
        window: How many positions each query sees, itself included.
        k_len: The number of keys ``Lk``; defaults to ``q_len``.
        device: Where to create the mask (default: PyTorch's default
            device).

    Example:
        >>> sliding_window_mask(5, window=3).int()  # W counts the query
        tensor([[1, 0, 0, 0, 0],
                [1, 1, 0, 0, 0],
                [1, 1, 1, 0, 0],
                [0, 1, 1, 1, 0],
                [0, 0, 1, 1, 1]], dtype=torch.int32)
    """
    k_len = q_len if k_len is None else k_len
    _check_lengths(q_len=q_len, k_len=k_len)
    if isinstance(window, bool) or not isinstance(window, int) \
            or window < 1:
        raise ValueError(f"window: expected a positive int, got {window!r}")
    ones = torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    causal = torch.tril(ones, diagonal=k_len - q_len)  # j <= p
    too_far = torch.tril(
        ones, diagonal=k_len - q_len - window)  # j <= p - window
    return causal & ~too_far  # (Lq, Lk)


def padding_mask(valid_lens: torch.Tensor, max_len: int | None = None
                 ) -> torch.Tensor:
    """Bool mask that lets every query attend only the first ``valid_lens``
    keys.

    ``valid_lens`` ``(B,)`` gives ``(B, 1, 1, Lk)``; ``(B, Lq)`` (one length
    per query, as d2l allows) gives ``(B, 1, Lq, Lk)``. Both broadcast to
    ``(B, H, Lq, Lk)``. ``max_len`` (``Lk``) defaults to the largest length.
    Keep the singleton axes: squeezed to ``(B, Lk)``, a module reads a 2-D
    mask as ``(Lq, Lk)``, which is wrong, and silently so when
    ``B == Lq``. Derived in chapter 7.

    Args:
        valid_lens: How many keys (from the start) each sample may attend
            to: ``(B,)``, or ``(B, Lq)`` for one length per query; whole
            numbers (an integer tensor, or a float one holding whole
            numbers).
        max_len: The number of keys ``Lk``, at least the largest length.

    Example:
        >>> m = padding_mask(torch.tensor([3, 1]))  # (B, 1, 1, Lk)
        >>> m.shape
        torch.Size([2, 1, 1, 3])
        >>> m[:, 0, 0].tolist()
        [[True, True, True], [True, False, False]]
    """
    if not isinstance(valid_lens, torch.Tensor):
        raise TypeError(f"valid_lens: expected a tensor of shape (B,) or "
                        f"(B, Lq), got {type(valid_lens).__name__}")
    if valid_lens.dim() not in (1, 2):
        raise ValueError(f"valid_lens: expected shape (B,) or (B, Lq), "
                         f"got shape {tuple(valid_lens.shape)}")
    if valid_lens.is_complex() or valid_lens.dtype == torch.bool:
        raise TypeError(f"valid_lens: expected an integer or float tensor, "
                        f"got {valid_lens.dtype}")
    _check_whole(valid_lens)
    if valid_lens.numel() and bool((valid_lens < 0).any()):
        raise ValueError(f"valid_lens: expected lengths >= 0, got a length "
                         f"of {valid_lens.min()}")
    if max_len is None:
        max_len = int(valid_lens.max()) if valid_lens.numel() else 0
    if isinstance(max_len, bool) or not isinstance(max_len, int) \
            or max_len < 0:
        raise ValueError(f"max_len: expected a non-negative int, "
                         f"got {max_len!r}")
    if valid_lens.numel() and bool((valid_lens > max_len).any()):
        raise ValueError(f"valid_lens: expected lengths <= max_len="
                         f"{max_len} (the number of keys), got a length of "
                         f"{valid_lens.max()}")
    positions = torch.arange(max_len, device=valid_lens.device)  # (Lk,)
    mask = positions < valid_lens.unsqueeze(-1)  # (B, Lk) or (B, Lq, Lk)
    if valid_lens.dim() == 1:
        return mask[:, None, None, :]  # (B, 1, 1, Lk)
    return mask[:, None, :, :]  # (B, 1, Lq, Lk)
