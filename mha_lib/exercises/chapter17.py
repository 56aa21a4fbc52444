"""Checkers for chapter 17's exercises (sliding windows, ALiBi,
FlexAttention)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from mha_lib.alibi import alibi_slopes
from mha_lib.exercises.verdict import Verdict, check_calls, close
from mha_lib.masks import sliding_window_mask

__all__ = ["check_window_mask_mod", "check_alibi_slopes",
           "check_receptive_field"]


def check_window_mask_mod(fn: Callable[[int], Callable]) -> Verdict:
    """Exercise 17.1: ``fn(window)`` returns a FlexAttention ``mask_mod(b,
    h, q_idx, kv_idx)`` (True = may attend) equal to
    :func:`~mha_lib.sliding_window_mask` for a square mask."""
    for length, window in ((6, 3), (9, 1), (5, 5), (8, 20)):
        i = torch.arange(length)[:, None]  # (L, 1) query positions
        j = torch.arange(length)[None, :]  # (1, L) key positions
        zero = torch.zeros((), dtype=torch.long)
        try:
            given = fn(window)(zero, zero, i, j)
        except Exception as error:
            # the reader's code: report it, do not crash the notebook
            return Verdict(False, f"fn({window})(b, h, q_idx, kv_idx) "
                                  f"raised {type(error).__name__}: {error}")
        if not isinstance(given, torch.Tensor) or given.dtype != torch.bool:
            return Verdict(False, f"fn({window}) should return bool "
                                  f"tensors (True = may attend), got "
                                  f"{getattr(given, 'dtype', type(given))}")
        expected = sliding_window_mask(length, window)
        if given.shape == expected.shape and window < length \
                and torch.equal(given, sliding_window_mask(length,
                                                           window + 1)):
            return Verdict(False, f"fn({window}) lets each query see "
                                  f"{window + 1} keys; the window counts "
                                  f"the query itself")
        if given.shape == expected.shape and torch.equal(
                given, torch.ones_like(expected).triu(-(window - 1))):
            return Verdict(False, f"fn({window}) lets queries see the "
                                  f"future: add the causal part "
                                  f"q_idx >= kv_idx")
        verdict = close(f"fn({window}) on {length} positions",
                        given.float(), expected.float(), "", 0.0, 0.0)
        if not verdict:
            return verdict
    return Verdict(True, "(q_idx >= kv_idx) & (q_idx - kv_idx < window), "
                         "the library's sliding_window_mask")


def check_alibi_slopes(fn: Callable[[int], list[float]]) -> Verdict:
    """Exercise 17.2: ``fn(num_heads)`` is the list of ALiBi's head
    slopes, also for a number of heads that is not a power of two."""
    for num_heads in (8, 16, 1, 4, 6, 12, 20):
        expected = torch.tensor(alibi_slopes(num_heads),
                                dtype=torch.float64)
        try:
            given = torch.as_tensor(fn(num_heads), dtype=torch.float64)
        except Exception as error:
            # the reader's code: report it, do not crash the notebook
            return Verdict(False, f"fn({num_heads}) raised "
                                  f"{type(error).__name__}: {error}")
        if given.shape == expected.shape and num_heads & (num_heads - 1) \
                and torch.allclose(given, torch.tensor(
                    [2.0 ** (-8 * (h + 1) / num_heads)
                     for h in range(num_heads)], dtype=torch.float64)):
            return Verdict(False, f"fn({num_heads}) uses 2^(-8/H) for "
                                  f"H={num_heads}, not a power of two; the "
                                  f"paper takes the nearest smaller power "
                                  f"of two, then every other slope of "
                                  f"twice as many heads")
        verdict = close(f"fn({num_heads})", given, expected, "",
                        atol=1e-12, rtol=1e-9)
        if not verdict:
            return verdict
    return Verdict(True, "2^(-8/H), 2^(-16/H), ...; for other H, the "
                         "slopes of the nearest smaller power of two and "
                         "every other slope of twice that")


def check_receptive_field(fn: Callable[[int, int], int]) -> Verdict:
    """Exercise 17.3: ``fn(window, num_layers)`` is how many positions
    back the last token's output can draw on after ``num_layers``
    sliding-window layers (measured by chaining the masks)."""
    def expected(window: int, num_layers: int) -> int:
        length = 1 + num_layers * window + 2  # longer than the reach
        step = sliding_window_mask(length, window).float()  # (L, L)
        reach = torch.eye(length)
        for _ in range(num_layers):
            reach = (step @ reach).clamp(max=1.0)  # who reaches whom
        first = int(reach[-1].nonzero().min())
        return (length - 1) - first

    cases = [(3, 1), (3, 2), (4, 3), (1, 5), (10, 4)]
    return check_calls(fn, cases, expected,
                       "each layer reaches window - 1 positions further "
                       "back: num_layers * (window - 1)")
