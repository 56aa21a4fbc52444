"""Checkers for chapter 10's exercises (the einsum / einops variant)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from mha_lib.exercises.verdict import Verdict, check_calls, close
from mha_lib.masks import causal_mask, padding_mask
from mha_lib.variants import EinsumMultiHeadAttention

__all__ = [
    "check_einsum_scores",
    "check_einops_mask",
    "check_einsum_num_parameters",
]


def check_einsum_scores(
    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> Verdict:
    """Exercise 10.1: ``fn(q, k)`` computes the scaled scores
    ``q k^T / sqrt(D)`` for chapter 8's layout, ``q (B, H, Lq, D)``,
    ``k (B, H, Lk, D)`` -> ``(B, H, Lq, Lk)``."""
    generator = torch.Generator().manual_seed(10)
    for batch, heads, q_len, k_len, head_dim in ((3, 4, 6, 6, 2),
                                                 (2, 3, 3, 5, 4),
                                                 (1, 2, 1, 7, 3)):
        q = torch.randn(batch, heads, q_len, head_dim, generator=generator)
        k = torch.randn(batch, heads, k_len, head_dim, generator=generator)
        try:
            given = fn(q, k)
        except Exception as error:
            # the reader's code: report it, do not crash the notebook
            return Verdict(
                False, f"fn(q of shape {tuple(q.shape)}, "
                       f"k of shape {tuple(k.shape)}) "
                       f"raised {type(error).__name__}: {error}")
        expected = (q @ k.transpose(-2, -1)
                    / math.sqrt(head_dim))  # (B, H, Lq, Lk)
        if (isinstance(given, torch.Tensor)
                and given.shape == expected.shape
                and torch.allclose(given, expected * math.sqrt(head_dim),
                                   atol=1e-5)):
            return Verdict(
                False, "the scores are not scaled: divide by sqrt(D), "
                       "the last dim of q")
        verdict = close(
            f"fn(q of shape {tuple(q.shape)}, k of shape {tuple(k.shape)})",
            given, expected, "")
        if not verdict:
            return verdict
    return Verdict(
        True, "'bhld,bhtd->bhlt': d is summed; b, h, l, t index the scores")


def check_einops_mask(
    fn: Callable[[torch.Tensor, int], torch.Tensor],
) -> Verdict:
    """Exercise 10.2: ``fn(valid_lens, length)`` builds the mask
    ``(B, L, L)`` of padding and causal masking together for the einops
    example's ``MultiHeadAttentionNew``, in that class's convention:
    True = blocked."""
    for valid_lens, length in ((torch.tensor([6, 4, 3]), 6),
                               (torch.tensor([2, 5]), 5),
                               (torch.tensor([1]), 3)):
        allowed = (padding_mask(valid_lens, length)[:, 0]
                   & causal_mask(length))  # (B, L, L)
        try:
            given = fn(valid_lens.clone(), length)
        except Exception as error:
            # the reader's code: report it, do not crash the notebook
            return Verdict(
                False, f"fn({valid_lens.tolist()}, {length}) raised "
                       f"{type(error).__name__}: {error}")
        name = f"fn({valid_lens.tolist()}, {length})"
        if not isinstance(given, torch.Tensor) or given.dtype != torch.bool:
            what = (given.dtype if isinstance(given, torch.Tensor)
                    else type(given).__name__)
            return Verdict(
                False, f"{name} should be a bool tensor, got {what}")
        if given.shape != allowed.shape:
            return Verdict(
                False, f"{name} should have shape {tuple(allowed.shape)} "
                       f"(B, L, L), got {tuple(given.shape)}")
        if torch.equal(given, allowed):
            return Verdict(
                False, f"{name} is the library's mask (True = may attend); "
                       f"the einops example blocks where its mask is True: "
                       f"invert it")
        if not torch.equal(given, ~allowed):
            return Verdict(
                False, f"{name} should be True exactly where a key is "
                       f"padding or in the future: "
                       f"{(~allowed).int().tolist()}")
    return Verdict(
        True,
        "True = blocked, the opposite of mha_lib: ~(padding & causal)")


def _einsum_num_parameters(
    n_head: int, d_model: int, d_k: int, d_v: int
) -> int:
    # shapes only: no memory, no use of the random state
    with torch.device("meta"):
        module = EinsumMultiHeadAttention(n_head, d_model, d_k, d_v)
    return sum(p.numel() for p in module.parameters())


def check_einsum_num_parameters(
    fn: Callable[[int, int, int, int], int],
) -> Verdict:
    """Exercise 10.3: ``fn(n_head, d_model, d_k, d_v)`` is the number of
    parameters of
    ``EinsumMultiHeadAttention(n_head, d_model, d_k, d_v)``."""
    cases = ((4, 8, 3, 5), (4, 8, 2, 2), (8, 512, 64, 64), (1, 6, 10, 1),
             (12, 96, 8, 16))
    return check_calls(
        fn, cases, _einsum_num_parameters,
        "3 input projections, fc back to d_model, LayerNorm's 2 * d_model")
