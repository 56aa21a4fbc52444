"""Checkers for chapter 5's exercises (splitting into heads)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from mha_lib.exercises.verdict import Verdict, close
from mha_lib.heads import merge_heads, split_heads

__all__ = ["check_split_heads", "check_merge_heads", "check_head_columns"]

# (B, L, d_model, H): the running example first, then shapes where mistakes
# show.
_CASES = ((3, 6, 8, 4), (2, 5, 12, 3), (1, 4, 6, 6), (2, 3, 8, 1))


def _inputs() -> list[tuple[torch.Tensor, int]]:
    generator = torch.Generator().manual_seed(5)
    return [(torch.randn(b, length, d, generator=generator), h)
            for b, length, d, h in _CASES]


def check_split_heads(
    fn: Callable[[torch.Tensor, int], torch.Tensor],
) -> Verdict:
    """Exercise 5.1: ``fn(x, num_heads)`` maps ``(B, L, H*D)`` to
    ``(B, H, L, D)`` as :func:`~mha_lib.split_heads` does."""
    for x, num_heads in _inputs():
        name = f"fn(x of shape {tuple(x.shape)}, num_heads={num_heads})"
        try:
            given = fn(x, num_heads)
        except Exception as error:
            # the reader's code: report it, do not crash the notebook
            return Verdict(
                False, f"{name} raised {type(error).__name__}: {error}")
        expected = split_heads(x, num_heads)
        # the view without transpose
        wrong = x.reshape(x.size(0), num_heads, x.size(1), -1)
        if (isinstance(given, torch.Tensor)
                and given.shape == expected.shape
                and torch.equal(given, wrong)
                and not torch.equal(given, expected)):
            return Verdict(
                False, f"{name} gives x.view(B, H, L, D): right shape, "
                       "but each head mixes tokens; view as (B, L, H, D), "
                       "then swap L and H")
        verdict = close(name, given, expected, "")
        if not verdict:
            return verdict
    return Verdict(
        True,
        "(B, L, H*D) -> (B, H, L, D), head h = columns h*D..(h+1)*D-1")


def check_merge_heads(
    fn: Callable[[torch.Tensor], torch.Tensor],
) -> Verdict:
    """Exercise 5.3: ``fn(x)`` maps ``(B, H, L, D)`` back to ``(B, L, H*D)``
    as :func:`~mha_lib.merge_heads` does, the inverse of
    :func:`~mha_lib.split_heads`."""
    for x, num_heads in _inputs():
        heads = split_heads(x, num_heads)
        name = f"fn(x of shape {tuple(heads.shape)})"
        try:
            given = fn(heads)
        except Exception as error:
            # the reader's code: report it, do not crash the notebook
            return Verdict(
                False, f"{name} raised {type(error).__name__}: {error}")
        verdict = close(name, given, merge_heads(heads), "")
        if not verdict:
            return verdict
    return Verdict(
        True, "(B, H, L, D) -> (B, L, H*D); fn(split_heads(x, H)) is x")


def check_head_columns(
    fn: Callable[[torch.Tensor, int, int], torch.Tensor],
) -> Verdict:
    """Exercise 5.2: ``fn(x, h, num_heads)`` returns head ``h`` of ``x``
    ``(B, L, H*D)`` as a ``(B, L, D)`` tensor, the same as
    ``split_heads(x, num_heads)[:, h]``."""
    for x, num_heads in _inputs():
        for h in range(num_heads):
            name = (f"fn(x of shape {tuple(x.shape)}, h={h}, "
                    f"num_heads={num_heads})")
            try:
                given = fn(x, h, num_heads)
            except Exception as error:
                # the reader's code: report it, do not crash the notebook
                return Verdict(
                    False,
                    f"{name} raised {type(error).__name__}: {error}")
            verdict = close(name, given, split_heads(x, num_heads)[:, h],
                            "")
            if not verdict:
                return verdict
    return Verdict(
        True, "head h is a block of D neighbouring columns of every token")
