"""Checkers for chapter 16's exercises (rotary position embeddings)."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch

from mha_lib.exercises.verdict import (
    Verdict,
    attempt,
    catalogue,
    check_calls,
    check_tensor,
)
from mha_lib.rotary import apply_rotary, rotary_angles

__all__ = ["check_rotate_half", "check_rotary_complex",
           "check_unturned_pairs"]

_PAIR = "Rotating one pair"
_LAYOUTS = "Two layouts of the pairs"
_FREQUENCIES = "Many pairs, many frequencies"

ROTATE_HALF = catalogue(
    "check_rotate_half", 16,
    signs_swapped=("the signs are swapped: that rotates by -angle; the "
                   "first half must be -x2, the second x1", _PAIR),
    no_minus=("the minus sign is missing: (x2, x1) is a reflection, the "
              "rotation needs (-x2, x1)", _PAIR),
    interleaved=("that rotates adjacent pairs (the paper's interleaved "
                 "layout); rotate half pairs feature i with i + D/2: "
                 "(-x2, x1) with x1, x2 the two halves", _LAYOUTS),
    reversed=("x.flip(-1) reverses the features; rotate half swaps the "
              "two halves, keeping each in order: (-x2, x1)", _LAYOUTS),
    adjacent_halves=("that takes x[..., 0::2] and x[..., 1::2], adjacent "
                     "features, as the halves; rotate half pairs feature "
                     "i with i + D/2: x1, x2 = x.chunk(2, dim=-1)",
                     _LAYOUTS),
    in_place=("it changes its input in place; x * cos + rotate_half(x) * "
              "sin still needs x: build a new tensor, e.g. with torch.cat",
              _PAIR),
)


def _rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    """Adjacent pairs (x0, x1) -> (-x1, x0): the interleaved layout's."""
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([-odd, even], dim=-1).flatten(-2)


def check_rotate_half(fn: Callable[[torch.Tensor], torch.Tensor]
                      ) -> Verdict:
    """Exercise 16.1: ``fn(x)`` is the "rotate half" of Llama-style code,
    so that ``x * cos + fn(x) * sin`` (with the angles repeated for both
    halves) is ``apply_rotary(x, positions)``."""
    generator = torch.Generator().manual_seed(16)
    for shape in ((5, 4), (2, 3, 6, 8), (1, 2)):
        x = torch.randn(*shape, generator=generator)
        given = x.clone()
        call = attempt(fn, given)
        if call.verdict is not None:
            return call.verdict
        if not torch.equal(given, x):
            return ROTATE_HALF["in_place"].verdict(call.label)
        x1, x2 = x.chunk(2, dim=-1)
        problem = check_tensor(
            call.label, call.value, torch.cat([-x2, x1], dim=-1),
            axes="(..., D)", mistakes=[
                (ROTATE_HALF["signs_swapped"], torch.cat([x2, -x1], -1)),
                (ROTATE_HALF["no_minus"], torch.cat([x2, x1], -1)),
                (ROTATE_HALF["interleaved"], _rotate_pairs(x)),
                (ROTATE_HALF["reversed"], x.flip(-1)),
                (ROTATE_HALF["adjacent_halves"],
                 torch.cat([-x[..., 1::2], x[..., 0::2]], -1)),
            ])
        if problem is not None:
            return problem
        positions = torch.arange(3, 3 + shape[-2])
        angles = rotary_angles(positions, shape[-1]).repeat(1, 2)  # (L, D)
        problem = check_tensor(
            f"x * cos + {call.label} * sin", x * angles.cos()
            + call.value * angles.sin(), apply_rotary(x, positions))
        if problem is not None:
            return problem
    return Verdict(True, "rotate_half(x) = (-x2, x1): x1 cos - x2 sin, "
                         "x1 sin + x2 cos, pair by pair")


COMPLEX = catalogue(
    "check_rotary_complex", 16,
    halves=("that pairs the two halves (rotate half); the paper pairs "
            "adjacent features, (x_2i, x_2i+1)", _LAYOUTS),
    not_complex=("the exercise multiplies complex numbers: "
                 "torch.view_as_complex, torch.polar, torch.view_as_real",
                 _PAIR),
    complex_result=("the result is complex: turn it back into real pairs "
                    "(torch.view_as_real, then flatten the last two dims)",
                    _LAYOUTS),
    positions_ignored=("the positions are given, and need not start at 0 "
                       "(after a cache they do not): rotate by "
                       "positions * theta, not arange(L) * theta",
                       "Rotary attention"),
    backwards=("that rotates by -angle (the conjugate): multiply by "
               "e^{+i m theta}", _PAIR),
    exponent_i=("the frequencies are off: theta_i = base ** (-2i / D) "
                "with i the pair index", _FREQUENCIES),
)


def _theta_i(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Adjacent pairs rotated with theta_i = 10000 ** (-i / D)."""
    d = x.size(-1)
    theta = 10000.0 ** (-torch.arange(d // 2, dtype=torch.float64) / d)
    angles = positions.double()[:, None] * theta  # (L, D/2)
    even, odd = x[..., 0::2].double(), x[..., 1::2].double()
    cos, sin = angles.cos(), angles.sin()
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos],
                       dim=-1).flatten(-2).float()


def check_rotary_complex(
    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> Verdict:
    """Exercise 16.2: ``fn(x, positions)`` rotates the adjacent pairs of
    ``x`` ``(..., L, D)`` as complex numbers, equal to
    ``apply_rotary(x, positions, interleaved=True)``."""
    generator = torch.Generator().manual_seed(17)
    for shape, start in (((2, 4, 5, 4), 7), ((6, 8), 0), ((3, 2), 1000)):
        x = torch.randn(*shape, generator=generator)
        positions = torch.arange(start, start + shape[-2])
        call = attempt(fn, x, positions,
                       shown=f"x {shape}, positions {start}..")
        if call.verdict is not None:
            return call.verdict
        if isinstance(call.value, torch.Tensor) and call.value.is_complex():
            return COMPLEX["complex_result"].verdict(call.label)
        length = torch.arange(shape[-2])
        problem = check_tensor(
            call.label, call.value,
            apply_rotary(x, positions, interleaved=True),
            axes="(..., L, D)", atol=1e-4, rtol=1e-4, mistakes=[
                (COMPLEX["halves"], partial(apply_rotary, x, positions)),
                (COMPLEX["positions_ignored"],
                 partial(apply_rotary, x, length, interleaved=True)),
                (COMPLEX["backwards"],
                 partial(apply_rotary, x, -positions, interleaved=True)),
                (COMPLEX["exponent_i"], partial(_theta_i, x, positions)),
            ])
        if problem is not None:
            return problem
        if not call.record.used(torch.view_as_complex, torch.complex,
                                torch.polar):
            return COMPLEX["not_complex"].verdict(call.label)
    return Verdict(True, "(x_2i + i x_2i+1) e^{i m theta_i}: the same "
                         "numbers as apply_rotary(..., interleaved=True)")


_BEYOND = "Beyond the trained length"

UNTURNED = catalogue(
    "check_unturned_pairs", 16,
    turned=("that counts the pairs that do complete a turn; the question "
            "is the ones that do not", _BEYOND),
    no_two_pi=("one turn is 2 pi radians: the wavelength is "
               "2 pi base^(2i/D), not base^(2i/D)", _BEYOND),
    all_features=("there are head_dim // 2 pairs, not head_dim", _BEYOND),
    fraction=("that is the share of the pairs; the question asks how "
              "many: the count, not count / (head_dim // 2)", _BEYOND),
    exponent_i=("the frequencies are base^(-2i/D) with i the pair index "
                "0 .. D/2 - 1", _FREQUENCIES),
    off_by_one=("positions 0 .. length - 1 span offsets up to length - 1: "
                "compare the wavelength with length - 1, not length",
                _BEYOND),
)


def _count(head_dim: int, base: float, length: int, two_pi: bool = True,
           pairs: int | None = None, exponent: float = 2.0,
           last: int | None = None) -> int:
    """Pairs whose wavelength exceeds ``length - 1`` (or ``last``), or a
    wrong count."""
    pairs = head_dim // 2 if pairs is None else pairs
    turn = 2 * math.pi if two_pi else 1.0
    last = length - 1 if last is None else last
    return sum(1 for i in range(pairs)
               if turn * base ** (exponent * i / head_dim) > last)


def check_unturned_pairs(fn: Callable[[int, float, int], int]) -> Verdict:
    """Exercise 16.3: ``fn(head_dim, base, length)`` is how many rotary
    pairs do not complete one full turn over positions ``0 .. length - 1``
    (wavelength ``2 pi / theta_i`` longer than ``length - 1``)."""
    def wrong(head_dim: int, base: float, length: int) -> list:
        return [(UNTURNED["turned"],
                 head_dim // 2 - _count(head_dim, base, length)),
                (UNTURNED["no_two_pi"],
                 _count(head_dim, base, length, two_pi=False)),
                (UNTURNED["all_features"],
                 _count(head_dim, base, length, pairs=head_dim)),
                (UNTURNED["exponent_i"],
                 _count(head_dim, base, length, exponent=1.0)),
                (UNTURNED["fraction"],
                 _count(head_dim, base, length) / (head_dim // 2)),
                (UNTURNED["off_by_one"],
                 _count(head_dim, base, length, last=length))]

    # In the last case pair 0's wavelength, 2 pi = 6.28, lies between
    # length - 1 and length: there `> length` gives another count.
    cases = [(8, 10000.0, 6), (64, 10000.0, 2048), (128, 10000.0, 4096),
             (128, 500000.0, 8192), (16, 100.0, 50), (8, 100.0, 7)]
    return check_calls(fn, cases, _count,
                       "pairs whose wavelength 2 pi base^(2i/D) exceeds "
                       "the positions seen never complete a turn",
                       mistakes=wrong)
