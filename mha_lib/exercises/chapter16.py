"""Checkers for chapter 16's exercises (rotary position embeddings)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from mha_lib.exercises.verdict import Verdict, check_calls, close
from mha_lib.rotary import apply_rotary, rotary_angles

__all__ = ["check_rotate_half", "check_rotary_complex",
           "check_unturned_pairs"]


def check_rotate_half(fn: Callable[[torch.Tensor], torch.Tensor]
                      ) -> Verdict:
    """Exercise 16.1: ``fn(x)`` is the "rotate half" of Llama-style code,
    so that ``x * cos + fn(x) * sin`` (with the angles repeated for both
    halves) is ``apply_rotary(x, positions)``."""
    generator = torch.Generator().manual_seed(16)
    for shape in ((5, 4), (2, 3, 6, 8), (1, 2)):
        x = torch.randn(*shape, generator=generator)
        positions = torch.arange(3, 3 + shape[-2])
        angles = rotary_angles(positions, shape[-1]).repeat(1, 2)  # (L, D)
        try:
            given = x * angles.cos() + fn(x) * angles.sin()
        except Exception as error:
            # the reader's code: report it, do not crash the notebook
            return Verdict(False, f"x * cos + fn(x) * sin for x of shape "
                                  f"{shape} raised {type(error).__name__}: "
                                  f"{error}")
        half = shape[-1] // 2
        swapped = torch.cat([x[..., half:], -x[..., :half]], dim=-1)
        wrong = x * angles.cos() + swapped * angles.sin()
        if torch.allclose(given, wrong) \
                and half > 0 and not torch.equal(x, torch.zeros_like(x)):
            return Verdict(
                False, "the signs are swapped: that rotates by -angle; "
                       "the first half must be -x2, the second x1")
        verdict = close(f"x * cos + fn(x) * sin (x of shape {shape})",
                        given, apply_rotary(x, positions), "")
        if not verdict:
            return verdict
    return Verdict(True, "rotate_half(x) = (-x2, x1): x1 cos - x2 sin, "
                         "x1 sin + x2 cos, pair by pair")


def check_rotary_complex(
    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> Verdict:
    """Exercise 16.2: ``fn(x, positions)`` rotates the adjacent pairs of
    ``x`` ``(..., L, D)`` as complex numbers, equal to
    ``apply_rotary(x, positions, interleaved=True)``."""
    generator = torch.Generator().manual_seed(17)
    for shape, start in (((6, 8), 0), ((2, 4, 5, 4), 7), ((3, 2), 1000)):
        x = torch.randn(*shape, generator=generator)
        positions = torch.arange(start, start + shape[-2])
        what = f"fn(x of shape {shape}, positions {start}..)"
        try:
            given = fn(x, positions)
        except Exception as error:
            # the reader's code: report it, do not crash the notebook
            return Verdict(
                False, f"{what} raised {type(error).__name__}: {error}")
        if isinstance(given, torch.Tensor) and given.is_complex():
            return Verdict(False, f"{what} is complex: turn it back into "
                                  f"real pairs (torch.view_as_real, then "
                                  f"flatten the last two dims)")
        half = apply_rotary(x, positions)  # the other layout
        if (shape[-1] > 2 and isinstance(given, torch.Tensor)
                and given.shape == half.shape
                and torch.allclose(given, half, atol=1e-4)):
            return Verdict(False, f"{what} pairs the two halves; the "
                                  f"paper pairs adjacent features")
        verdict = close(what, given,
                        apply_rotary(x, positions, interleaved=True), "",
                        atol=1e-4, rtol=1e-4)
        if not verdict:
            return verdict
    return Verdict(True, "(x_2i + i x_2i+1) e^{i m theta_i}: the same "
                         "numbers as apply_rotary(..., interleaved=True)")


def check_unturned_pairs(fn: Callable[[int, float, int], int]) -> Verdict:
    """Exercise 16.3: ``fn(head_dim, base, length)`` is how many rotary
    pairs do not complete one full turn over positions ``0 .. length - 1``
    (wavelength ``2 pi / theta_i`` longer than ``length - 1``)."""
    def expected(head_dim: int, base: float, length: int) -> int:
        return sum(
            1 for i in range(head_dim // 2)
            if 2 * math.pi * base ** (2 * i / head_dim) > length - 1)

    cases = [(8, 10000.0, 6), (64, 10000.0, 2048), (128, 10000.0, 4096),
             (128, 500000.0, 8192), (16, 100.0, 50)]
    return check_calls(fn, cases, expected,
                       "pairs whose wavelength 2 pi base^(2i/D) exceeds "
                       "the positions seen never complete a turn")
