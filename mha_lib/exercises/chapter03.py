"""Checkers for chapter 3's exercises (positional encoding)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from mha_lib.exercises.verdict import Verdict, close
from mha_lib.positional import sinusoidal_encoding

__all__ = ["check_sinusoidal", "check_shift_matrix"]


def check_sinusoidal(fn: Callable[[int, int], torch.Tensor]) -> Verdict:
    """Exercise 3.1: ``fn(length, d_model)`` returns the sinusoidal table of
    :func:`~mha_lib.sinusoidal_encoding`, however it computes the
    frequencies."""
    for length, d_model in ((6, 8), (1, 2), (50, 16), (100, 64)):
        try:
            given = fn(length, d_model)
        except Exception as error:
            # the reader's code: report it, do not crash the notebook
            return Verdict(
                False, f"fn({length}, {d_model}) raised "
                       f"{type(error).__name__}: {error}")
        # Other ways of computing 10000^(2i/d) differ in the last bits;
        # angles up to 99 turn that into differences of about 1e-5, so
        # allow 1e-4.
        verdict = close(f"fn({length}, {d_model})", given,
                        sinusoidal_encoding(length, d_model),
                        "", atol=1e-4, rtol=0.0)
        if not verdict:
            return verdict
    return Verdict(
        True,
        "the same table as mha_lib.sinusoidal_encoding for four sizes")


def check_shift_matrix(
    M: torch.Tensor, k: int = 3, d_model: int = 8
) -> Verdict:
    """Exercise 3.2: a ``(d_model, d_model)`` matrix with
    ``PE[pos + k] = M @ PE[pos]`` for every position, the same matrix for
    all of them."""
    pe = sinusoidal_encoding(64 + k, d_model)  # (L + k, d_model)
    if not isinstance(M, torch.Tensor):
        return Verdict(
            False, f"M should be a tensor, got {type(M).__name__}")
    if M.shape != (d_model, d_model):
        return Verdict(
            False, f"M should have shape {(d_model, d_model)}, "
                   f"got {tuple(M.shape)}")
    # row pos holds M @ PE[pos]
    shifted = pe[:-k] @ M.detach().to(pe.dtype).T
    return close(
        f"M @ PE[pos] for pos = 0..63 (compared with PE[pos + {k}])",
        shifted, pe[k:],
        f"one matrix moves every position {k} steps on, a rotation "
        "per pair",
        atol=1e-4, rtol=0.0)
