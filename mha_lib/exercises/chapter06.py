"""Checkers for chapter 6's exercises (scaled dot-product attention)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from mha_lib.attention import scaled_dot_product_attention
from mha_lib.exercises.verdict import Verdict, close

__all__ = ["check_attention", "check_temperature", "check_softmax_jacobian"]

# (batch..., Lq, Lk, D, Dv): self-attention, cross-attention (Lq != Lk),
# D != Dv, no batch.
_SHAPES = [((3, 4), 6, 6, 2, 2), ((2,), 3, 5, 4, 7), ((), 1, 4, 8, 3)]


def _qkv(seed: int, batch: tuple[int, ...], lq: int, lk: int, d: int,
         dv: int):
    # private: the reader's global seed is untouched
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*batch, lq, d, generator=g),
            torch.randn(*batch, lk, d, generator=g),
            torch.randn(*batch, lk, dv, generator=g))


def _call(fn: Callable, *args):
    try:
        return fn(*args), None
    except Exception as error:
        # the reader's code: report it, do not crash the notebook
        return None, Verdict(
            False, f"calling it raised {type(error).__name__}: {error}")


def _compare_pair(
    got: object, want: tuple[torch.Tensor, torch.Tensor], where: str
) -> Verdict:
    """The reader's ``(output, weights)`` against the library's, weights
    first."""
    if not isinstance(got, tuple) or len(got) != 2:
        return Verdict(False, f"fn should return a pair (output, weights), "
                              f"got {type(got).__name__}")
    for name, given, expected in (("weights", got[1], want[1]),
                                  ("output", got[0], want[0])):
        verdict = close(f"{name} {where}", given, expected, "")
        if not verdict:
            return verdict
    return Verdict(True, "")


def check_attention(
    fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor],
                 tuple[torch.Tensor, torch.Tensor]],
) -> Verdict:
    """Exercise 6.1: ``fn(q, k, v) -> (output, weights)``, unmasked scaled
    dot-product attention, for any leading dims, ``Lq != Lk`` and
    ``D != Dv``."""
    for seed, (batch, lq, lk, d, dv) in enumerate(_SHAPES):
        q, k, v = _qkv(seed, batch, lq, lk, d, dv)
        got, error = _call(fn, q, k, v)
        if error is not None:
            return error
        shape = (f"q {tuple(q.shape)}, k {tuple(k.shape)}, "
                 f"v {tuple(v.shape)}")
        verdict = _compare_pair(got, scaled_dot_product_attention(q, k, v),
                                f"for {shape}")
        if not verdict:
            return verdict
    return Verdict(True, "output and weights as mha_lib's, for self- and "
                         "cross-attention")


def check_temperature(
    fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float],
                 tuple[torch.Tensor, torch.Tensor]],
) -> Verdict:
    """Exercise 6.2: ``fn(q, k, v, tau) -> (output, weights)`` with weights
    ``softmax(q k^T / (tau * sqrt(D)))``."""
    q, k, v = _qkv(6, (2, 4), 6, 6, 8, 8)
    for tau in (0.25, 1.0, 3.0):
        got, error = _call(fn, q, k, v, tau)
        if error is not None:
            return error
        scale = 1.0 / (tau * math.sqrt(q.size(-1)))
        want = scaled_dot_product_attention(q, k, v, scale=scale)
        verdict = _compare_pair(got, want, f"at tau={tau}")
        if not verdict:
            return verdict
    return Verdict(True, "as mha_lib's with scale = 1 / (tau sqrt(D)), "
                         "tau = 0.25, 1, 3")


def check_softmax_jacobian(
    fn: Callable[[torch.Tensor], torch.Tensor],
) -> Verdict:
    """Exercise 6.3: ``fn(scores) -> J`` with
    ``J[i, j] = d softmax(scores)_i / d scores_j`` for a 1-D ``scores``;
    compared with autograd."""
    g = torch.Generator().manual_seed(7)
    for scores in (torch.randn(6, generator=g, dtype=torch.float64),
                   20.0 * torch.randn(4, generator=g, dtype=torch.float64)):
        got, error = _call(fn, scores.clone())
        if error is not None:
            return error
        want = torch.autograd.functional.jacobian(
            lambda s: torch.softmax(s, dim=-1), scores)
        verdict = close(f"the Jacobian for {scores.numel()} scores", got,
                        want, "", atol=1e-6, rtol=1e-5)
        if not verdict:
            return verdict
    return Verdict(
        True, "J = diag(p) - p p^T, as autograd's Jacobian of the softmax")
