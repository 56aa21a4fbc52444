"""Checkers for chapter 7's exercises (padding and causal masks, a safe
softmax)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from mha_lib.attention import masked_softmax
from mha_lib.exercises.verdict import Verdict, close
from mha_lib.masks import causal_mask, padding_mask

__all__ = ["check_padding_mask", "check_decoder_mask", "check_safe_softmax"]


def _call(fn: Callable, *args):
    try:
        return fn(*args), None
    except Exception as error:
        # the reader's code: report it, do not crash the notebook
        return None, Verdict(
            False, f"calling it raised {type(error).__name__}: {error}")


def _same_mask(
    name: str, given: object, want: torch.Tensor
) -> Verdict | None:
    """None when ``given`` is the bool mask ``want``, else what is wrong."""
    if not isinstance(given, torch.Tensor):
        return Verdict(
            False, f"{name} should be a tensor, got {type(given).__name__}")
    if given.dtype != torch.bool:
        return Verdict(
            False, f"{name} should be a bool tensor (True = may attend), "
                   f"got dtype {given.dtype}")
    if given.shape != want.shape:
        return Verdict(
            False, f"{name} should have shape {tuple(want.shape)}, "
                   f"got {tuple(given.shape)}")
    if not torch.equal(given, want):
        wrong = (given != want).nonzero()[0].tolist()
        return Verdict(
            False, f"{name} differs from the expected mask, "
                   f"first at index {wrong}: "
                   f"got {bool(given[tuple(wrong)])}, "
                   f"expected {bool(want[tuple(wrong)])}")
    return None


def check_padding_mask(
    fn: Callable[[torch.Tensor, int], torch.Tensor],
) -> Verdict:
    """Exercise 7.1: ``fn(lengths (B,), max_len) -> (B, 1, 1, max_len)``
    bool mask, True for the first ``lengths[b]`` keys of sentence ``b``."""
    cases = [(torch.tensor([6, 6, 6, 3]), 6), (torch.tensor([2, 0, 5]), 5),
             (torch.tensor([1, 4]), 7)]
    for lengths, max_len in cases:
        given, error = _call(fn, lengths.clone(), max_len)
        if error is not None:
            return error
        wrong = _same_mask(f"fn({lengths.tolist()}, {max_len})", given,
                           padding_mask(lengths, max_len))
        if wrong is not None:
            return wrong
    return Verdict(
        True,
        "the same masks as mha_lib.padding_mask, shape (B, 1, 1, Lk)")


def check_decoder_mask(
    fn: Callable[[torch.Tensor], torch.Tensor],
) -> Verdict:
    """Exercise 7.2: ``fn(lengths (B,)) -> (B, 1, L, L)`` bool mask,
    ``L = max(lengths)``: a key is visible when it is a real token and not
    in the query's future."""
    for lengths in (torch.tensor([6, 6, 6, 3]), torch.tensor([2, 5, 1])):
        length = int(lengths.max())
        want = (padding_mask(lengths, length)
                & causal_mask(length))  # (B, 1, L, L)
        given, error = _call(fn, lengths.clone())
        if error is not None:
            return error
        wrong = _same_mask(f"fn({lengths.tolist()})", given, want)
        if wrong is not None:
            return wrong
    return Verdict(
        True,
        "padding_mask(lengths) & causal_mask(L), shape (B, 1, L, L)")


def check_safe_softmax(
    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> Verdict:
    """Exercise 7.3: ``fn(scores, mask) -> weights`` like
    :func:`~mha_lib.masked_softmax` for a bool mask: zero weight on masked
    keys, all-zero rows when nothing is visible, never NaN, in float32 and
    float16."""
    g = torch.Generator().manual_seed(7)
    scores = 3.0 * torch.randn(2, 4, 5, generator=g)  # (B, Lq, Lk)
    mask = torch.rand(2, 4, 5, generator=g) > 0.4
    mask[0, 1] = False  # a query with nothing to attend to
    mask[1, 2] = True  # one that sees everything
    for dtype in (torch.float32, torch.float16):
        s = scores.to(dtype)
        given, error = _call(fn, s.clone(), mask.clone())
        if error is not None:
            return error
        if isinstance(given, torch.Tensor) and given.isnan().any():
            return Verdict(
                False, f"the weights for {dtype} scores contain NaN "
                       f"(a fully masked row?)")
        if isinstance(given, torch.Tensor) and given.dtype != dtype:
            return Verdict(
                False, f"for {dtype} scores the weights should be {dtype}, "
                       f"got {given.dtype}")
        if (isinstance(given, torch.Tensor) and given.shape == s.shape
                and given[0, 1].any()):
            return Verdict(
                False, f"query 1 of sample 0 sees no key, so its weights "
                       f"should be all zeros, got "
                       f"{[round(w, 4) for w in given[0, 1].tolist()]} "
                       f"for {dtype} scores")
        tol = 1e-5 if dtype == torch.float32 else 1e-3
        verdict = close(f"the weights for {dtype} scores", given,
                        masked_softmax(s, mask), "", atol=tol, rtol=tol)
        if not verdict:
            return verdict
    return Verdict(True, "as mha_lib.masked_softmax, empty rows zero, "
                         "float32 and float16")
