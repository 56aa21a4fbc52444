"""What every checker returns, and the book's running example."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

__all__ = ["Verdict", "compare", "close", "check_calls", "SENTENCES"]

# The book's running example (from Phillips' multi-head attention article):
# three sentences of six tokens each.
SENTENCES = [
    "I wonder what will come next!",
    "This is a basic example paragraph.",
    "Hello, what is a basic split?",
]


@dataclass(frozen=True)
class Verdict:
    """The outcome of a check: ``ok`` and a message for the reader.

    Prints as ``Correct: ...`` or ``Not yet: ...``; ``bool(verdict)`` is
    ``ok``.

    Args:
        ok: Whether the answer is right.
        message: What was checked, or what is still wrong, with a hint.
    """

    ok: bool
    message: str

    def __bool__(self) -> bool:
        return self.ok

    def __repr__(self) -> str:
        """``Correct: ...`` or ``Not yet: ...``, wrapped at 74 characters
        so that it fits the book's solution boxes."""
        text = ("Correct: " if self.ok else "Not yet: ") + self.message
        return textwrap.fill(text, width=74, subsequent_indent="  ",
                             break_long_words=False, break_on_hyphens=False)


def compare(
    name: str, given: object, expected: object, success: str
) -> Verdict:
    """Equality check of plain Python values."""
    if given == expected:
        return Verdict(True, success)
    return Verdict(False, f"{name} should be {expected!r}, got {given!r}")


def close(name: str, given: object, expected: torch.Tensor, success: str,
          atol: float = 1e-5, rtol: float = 1e-5) -> Verdict:
    """Tensor check: type, shape, then values within tolerance."""
    if not isinstance(given, torch.Tensor):
        return Verdict(
            False, f"{name} should be a tensor, got {type(given).__name__}")
    if given.shape != expected.shape:
        return Verdict(
            False, f"{name} should have shape {tuple(expected.shape)}, "
                   f"got {tuple(given.shape)}")
    if not torch.allclose(given.detach().to(expected.dtype), expected,
                          atol=atol, rtol=rtol):
        worst = (given.detach().to(expected.dtype)
                 - expected).abs().max().item()
        return Verdict(
            False, f"{name} has the right shape but different values "
                   f"(largest difference {worst:.3g})")
    return Verdict(True, success)


def check_calls(
    fn: Callable, cases: Iterable[tuple], expected: Callable, success: str
) -> Verdict:
    """Call the reader's ``fn(*args)`` for every ``args`` in ``cases`` and
    compare with ``expected(*args)``; the first wrong or raising call is the
    hint."""
    for args in cases:
        call = f"fn({', '.join(map(repr, args))})"
        want = expected(*args)
        try:
            given = fn(*args)
        except Exception as error:
            # the reader's code: report it, do not crash the notebook
            return Verdict(
                False, f"{call} raised {type(error).__name__}: {error}")
        if given != want:
            number = isinstance(want, int) and not isinstance(want, bool)
            shown = f"{want:,}" if number else repr(want)
            return Verdict(
                False, f"{call} should be {shown}, got {given!r}")
    return Verdict(True, success)
