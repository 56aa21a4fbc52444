"""What every checker returns, the one way to call the reader's code, the
catalogue of classic mistakes, and the book's running example.

A checker calls the reader's function with :func:`attempt` (which turns an
exception into a ``Not yet`` naming the call, and records the torch
functions the call used, for the exercises that forbid some), compares
the result with :func:`check_tensor` or :func:`check_number` (which never
print the expected answer: they say how far off, and name a catalogued
mistake when the answer is one), and returns a :class:`Verdict`.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import keyword
import math
import re
import textwrap
import tokenize
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from numbers import Number

import torch
from torch.overrides import TorchFunctionMode

__all__ = [
    "Verdict",
    "Mistake",
    "CATALOGUE",
    "catalogue",
    "Recorder",
    "Attempt",
    "attempt",
    "calls_to",
    "describe",
    "check_tensor",
    "check_number",
    "check_calls",
    "passed",
    "plain",
    "source_names",
    "MATMUL",
    "indexes_with_tensor",
    "SENTENCES",
]

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


# --- the catalogue of classic mistakes ------------------------------------

def plain(heading: str) -> str:
    """A notebook heading as plain text: no backticks, no TeX."""
    text = heading.replace("`", "")
    text = re.sub(r"\\text\{([^}]*)\}", r"\1", text)
    text = re.sub(r"\\sqrt\{([^}]*)\}", r"sqrt(\1)", text)
    text = text.replace(r"\times", "x").replace(r"\infty", "inf")
    return " ".join(text.replace("$", "").split())


def see(section: str, chapter: int) -> str:
    """Where the book explains something: ``(see 'Section' in chapter N)``,
    as every hint ends."""
    return f"(see '{plain(section)}' in chapter {chapter})"


@dataclass(frozen=True)
class Mistake:
    """A classic mistake that a checker recognises.

    Args:
        checker: The checker that recognises it, e.g. ``"check_attention"``.
        name: A short name, unique for that checker.
        hint: What is wrong, named, and how to fix it.
        chapter: The chapter whose section explains it.
        section: That section's heading, as the notebook writes it.
    """

    checker: str
    name: str
    hint: str
    chapter: int
    section: str

    @property
    def message(self) -> str:
        """The hint and where the book explains it."""
        return f"{self.hint} {see(self.section, self.chapter)}"

    def verdict(self, label: str = "") -> Verdict:
        """``Not yet`` with the hint, after ``label`` (what was called)."""
        return Verdict(False, f"{label}: {self.message}" if label
                       else self.message)


# checker name -> {mistake name -> Mistake}, filled as the chapters load
CATALOGUE: dict[str, dict[str, Mistake]] = {}


def catalogue(checker: str, chapter: int,
              **entries: tuple[str, str] | tuple[str, str, int]
              ) -> dict[str, Mistake]:
    """Register the mistakes ``checker`` recognises: ``name=(hint,
    section)``, or ``(hint, section, chapter)`` when another chapter
    explains it."""
    mistakes = {}
    for name, entry in entries.items():
        hint, section, *other = entry
        mistakes[name] = Mistake(checker, name, hint,
                                 other[0] if other else chapter, section)
    CATALOGUE[checker] = mistakes
    return mistakes


# --- calling the reader's code --------------------------------------------

class Recorder(TorchFunctionMode):
    """Records every torch function the reader's code calls (the calls it
    makes itself, not those inside another torch function)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Callable, tuple, dict]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.calls.append((func, args, kwargs))
        return func(*args, **kwargs)

    def find(self, *funcs: Callable) -> list[tuple[Callable, tuple, dict]]:
        """The recorded calls of any of ``funcs``."""
        return [call for call in self.calls if call[0] in funcs]

    def used(self, *funcs: Callable) -> bool:
        """Whether any of ``funcs`` was called."""
        return bool(self.find(*funcs))


def describe(value: object) -> str:
    """A short description of an argument: a tensor by its shape."""
    if isinstance(value, torch.Tensor):
        if value.dim() == 0:
            return f"{value.item():g}"
        if value.dim() == 1 and value.numel() <= 6 \
                and not value.is_floating_point():
            return str(value.tolist())
        return str(tuple(value.shape))
    if isinstance(value, torch.nn.Module):
        return type(value).__name__
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(v, torch.Tensor) for v in value):
        return f"{len(value)} tensors {tuple(value[0].shape)}"
    if isinstance(value, torch.dtype):
        return str(value)
    text = repr(value)
    return text if len(text) <= 30 else type(value).__name__


def _described(fn: Callable, args: tuple, kwargs: dict) -> list[str]:
    """The arguments of a call, tensors and modules named after the
    reader's parameters: ``q (3, 4, 6, 2)``, ``num_heads=4``."""
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        names = []
    parts = []
    for i, value in enumerate(args):
        name = names[i] if i < len(names) else None
        text = describe(value)
        if name and isinstance(value, (torch.Tensor, torch.nn.Module,
                                       list, tuple)):
            text = (name if isinstance(value, torch.nn.Module)
                    else f"{name} {text}")
        parts.append(text)
    parts += [f"{k}={describe(v)}" for k, v in kwargs.items()]
    return parts


def _name(fn: object) -> str:
    name = getattr(fn, "__name__", "")
    return name if name.isidentifier() else "fn"


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    line = text[0] if text else ""
    return line if len(line) <= 160 else line[:157] + "..."


@dataclass
class Attempt:
    """One call of the reader's function.

    ``value`` is what it returned; ``verdict`` is ``None``, or a
    ``Not yet`` when it raised; ``record`` holds the torch functions it
    called; ``label`` names the call in messages, e.g.
    ``attention(q (3, 4, 6, 2), k (3, 4, 6, 2), v (3, 4, 6, 2))``.
    """

    label: str
    value: object = None
    verdict: Verdict | None = None
    error: BaseException | None = None
    record: Recorder = field(default_factory=Recorder)


def attempt(
    fn: Callable, *args: object, shown: str | None = None,
    explain: Callable[[BaseException, Recorder], Mistake | None] | None
    = None,
    **kwargs: object,
) -> Attempt:
    """Call ``fn(*args, **kwargs)``, the reader's code, and report.

    An exception is the reader's, never the checker's: it becomes a
    ``Not yet`` that names the call (``shown`` describes the arguments;
    by default their shapes), what it raised and, when ``explain`` maps
    it to a catalogued mistake, that mistake's hint.
    """
    if shown is None:
        shown = ", ".join(_described(fn, args, kwargs))
    label = f"{_name(fn)}({shown})"
    result = Attempt(label)
    try:
        with result.record:
            result.value = fn(*args, **kwargs)
    except Exception as error:  # the reader's code: report, do not crash
        result.error = error
        text = (f"your {label} raised {type(error).__name__}: "
                f"{_first_line(error).rstrip('.')}")
        mistake = explain(error, result.record) if explain else None
        if mistake is not None:
            text += f". {mistake.message}"
        result.verdict = Verdict(False, text)
    return result


@contextlib.contextmanager
def calls_to(module: torch.nn.Module,
             counts: Callable[[tuple], bool] | None = None,
             ) -> Iterator[list]:
    """A list that gets an entry each time ``module`` is called inside the
    ``with`` block (a forward pre-hook, removed on leaving), or only the
    calls whose positional arguments ``counts`` accepts: how a checker sees
    that the reader's code called a module it was to compute without."""
    called: list = []

    def hook(_: torch.nn.Module, args: tuple) -> None:
        if counts is None or counts(args):
            called.append(True)

    handle = module.register_forward_pre_hook(hook)
    try:
        yield called
    finally:
        handle.remove()


def source_names(fn: Callable) -> set[str]:
    """The identifiers in ``fn``'s source code (empty when the source is
    not available), without the name it is defined under."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return set()
    names = set()
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.NAME \
                    and not keyword.iskeyword(token.string):
                names.add(token.string)
    except (tokenize.TokenError, SyntaxError, IndentationError):
        pass  # a lambda's line may end mid-expression: keep what was read
    names.discard(getattr(fn, "__name__", ""))
    return names


# Matrix products, however they are spelled.
MATMUL = (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__,
          torch.Tensor.__rmatmul__, torch.mm, torch.Tensor.mm, torch.bmm,
          torch.Tensor.bmm, torch.einsum, torch.tensordot,
          torch.nn.functional.linear, torch.addmm, torch.Tensor.addmm,
          torch.baddbmm, torch.inner, torch.Tensor.inner)


def indexes_with_tensor(call: tuple[Callable, tuple, dict]) -> bool:
    """Whether a recorded call is ``x[index]`` with a tensor or list in
    the index (a lookup, not a slice)."""
    func, args, _ = call
    if func is not torch.Tensor.__getitem__ or len(args) < 2:
        return False
    index = args[1] if isinstance(args[1], tuple) else (args[1],)
    return any(isinstance(i, (torch.Tensor, list)) for i in index)


# --- comparing without giving the answer away -----------------------------

# A wrong answer, or a function that builds it (only when needed) or that
# says whether the given answer shows the mistake.
Candidate = torch.Tensor | Callable[[], torch.Tensor | bool]


def _shape(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return str(tuple(value.shape))
    return type(value).__name__


def _matches(given: torch.Tensor, candidate: Candidate, atol: float,
             rtol: float) -> bool:
    try:
        wrong = candidate() if callable(candidate) else candidate
    except Exception:  # a mistake that cannot be built for these inputs
        return False
    if isinstance(wrong, bool):  # a test of the answer, not an answer
        return wrong
    if not isinstance(wrong, torch.Tensor) or wrong.shape != given.shape:
        return False
    if given.dtype == torch.bool or wrong.dtype == torch.bool:
        return torch.equal(given.bool(), wrong.bool())
    return torch.allclose(given.detach().double(), wrong.detach().double(),
                          atol=atol, rtol=rtol, equal_nan=True)


def _index(flat: int, shape: torch.Size) -> list[int]:
    """The index of element ``flat`` of a row-major tensor of ``shape``
    (torch.unravel_index costs seconds the first time: it imports
    sympy)."""
    index = []
    for size in reversed(shape):
        flat, i = divmod(flat, size)
        index.append(i)
    return index[::-1]


def _how_far(given: torch.Tensor, expected: torch.Tensor, atol: float,
             rtol: float) -> str:
    """How ``given`` differs from ``expected``, without showing
    ``expected``."""
    if expected.dtype == torch.bool:
        wrong = given.bool() != expected
        first = _index(int(wrong.flatten().nonzero()[0]), wrong.shape)
        count = int(wrong.sum())
        return (f"{count} of {wrong.numel()} entries "
                f"{'is' if count == 1 else 'are'} wrong, "
                f"the first at index {first} (yours is "
                f"{bool(given[tuple(first)])} there; True = may attend)")
    g = given.detach().double()
    e = expected.detach().double()
    bad_values = ~torch.isfinite(g)
    if bad_values.any() and torch.isfinite(e).all():
        first = _index(int(bad_values.flatten().nonzero()[0]), g.shape)
        return (f"{int(bad_values.sum())} entries are NaN or inf, the "
                f"first at index {first}")
    diff = g - e
    off = ~torch.isclose(g, e, atol=atol, rtol=rtol)
    big = e.abs() > 1e-3
    if big.sum() >= 2:
        ratio = g[big] / e[big]
        r = ratio.mean().item()
        if (ratio - r).abs().max().item() <= 1e-3 * abs(r) and r != 0:
            if abs(r + 1) < 1e-3:
                return "it has the opposite sign everywhere"
            return (f"it is {r:.3g} times the right values everywhere: a "
                    f"factor is missing or extra")
    shift = diff.mean().item()
    if off.sum() >= 2 and (diff - shift).abs().max().item() <= atol + 1e-6:
        return (f"it is off by the same amount everywhere ({shift:+.3g}): "
                f"a term is missing or extra")
    worst = int(diff.abs().flatten().argmax())
    where = _index(worst, diff.shape)
    size = diff.flatten()[worst].item()
    count = int(off.sum())
    return (f"{count} of {off.numel()} entries "
            f"{'is' if count == 1 else 'are'} off, by up to "
            f"{abs(size):.3g} (at index {where} yours is too "
            f"{'large' if size > 0 else 'small'})")


def check_tensor(
    label: str, given: object, expected: torch.Tensor, *,
    axes: str | None = None,
    mistakes: Iterable[tuple[Mistake, Candidate]] = (),
    atol: float = 1e-5, rtol: float = 1e-5,
    dtype: bool = False,
) -> Verdict | None:
    """``None`` when ``given`` is ``expected`` (type, shape, values within
    tolerance; the dtype too if ``dtype``), else a ``Not yet``: the
    first catalogued mistake ``given`` matches (``mistakes`` pairs a
    mistake with the wrong answer it would give), or how far off it is.
    ``axes`` names the dimensions in messages, e.g. ``"(B, H, L, D)"``."""
    named = f"{axes} = " if axes else ""
    if not isinstance(given, torch.Tensor):
        return Verdict(False, f"{label} should give a tensor "
                              f"{named}{tuple(expected.shape)}, got "
                              f"{type(given).__name__}")
    mistakes = list(mistakes)
    if given.shape != expected.shape:
        for mistake, candidate in mistakes:
            if _matches(given, candidate, atol, rtol):
                return mistake.verdict(label)
        return Verdict(False, f"{label}: expected shape {named}"
                              f"{tuple(expected.shape)}, got "
                              f"{tuple(given.shape)}")
    if expected.dtype == torch.bool and given.dtype != torch.bool:
        return Verdict(False, f"{label} should be a bool tensor (True = "
                              f"may attend), got dtype {given.dtype}")
    if dtype and given.dtype != expected.dtype:
        return Verdict(False, f"{label} should have dtype "
                              f"{expected.dtype}, got {given.dtype}")
    if given.is_complex():
        return Verdict(False, f"{label} is complex; the answer is real")
    if expected.dtype == torch.bool:
        same = torch.equal(given, expected)
    else:
        same = torch.allclose(given.detach().to(expected.dtype), expected,
                              atol=atol, rtol=rtol)
    if same:
        return None
    for mistake, candidate in mistakes:
        if _matches(given, candidate, atol, rtol):
            return mistake.verdict(label)
    return Verdict(False, f"{label} has the right shape but different "
                          f"values: "
                          f"{_how_far(given, expected, atol, rtol)}")


def _far_words(given: float, expected: float) -> str:
    """How far off and in which direction, in bands too coarse to give
    the expected number away."""
    if expected == 0 or given / expected <= 0:
        return "has the wrong sign" if given else "should not be zero"
    ratio = given / expected
    off = max(ratio, 1 / ratio)
    way = "large" if ratio > 1 else "small"
    for least, words in ((100, f"more than 100 times too {way}"),
                         (10, f"10 to 100 times too {way}"),
                         (2, f"2 to 10 times too {way}"),
                         (1.1, f"too {way}, by 10 % to a factor of 2"),
                         (1.01, f"too {way}, by 1 to 10 %")):
        if off >= least:
            return f"is {words}"
    return f"is too {way}, by less than 1 %"


def check_number(
    label: str, given: object, expected: float, *,
    mistakes: Iterable[tuple[Mistake, float]] = (),
    rel: float = 0.0,
) -> Verdict | None:
    """``None`` when the number ``given`` equals ``expected`` (within the
    relative tolerance ``rel``), else a ``Not yet``: the catalogued
    mistake it matches, or how far off it is and in which direction
    (never the expected number)."""
    if isinstance(given, torch.Tensor) and given.numel() == 1:
        given = given.item()
    if isinstance(given, bool) or not isinstance(given, Number):
        return Verdict(False, f"{label} should be a number, got "
                              f"{type(given).__name__}")
    given = float(given) if not isinstance(given, int) else given

    def equal(a: float, b: float) -> bool:
        return (a == b if rel == 0 else
                math.isclose(a, b, rel_tol=rel, abs_tol=1e-12))

    if equal(given, expected):
        return None
    for mistake, wrong in mistakes:
        if wrong != expected and equal(given, wrong):
            return mistake.verdict(f"{label} = {given!r}")
    return Verdict(False, f"{label} = {given!r} "
                          f"{_far_words(given, expected)}")


def check_calls(
    fn: Callable, cases: Iterable[tuple], expected: Callable, success: str,
    mistakes: Callable[..., Iterable[tuple[Mistake, float]]] | None = None,
    refuse: Callable[[Recorder], Mistake | None] | None = None,
) -> Verdict:
    """Call the reader's ``fn(*args)`` for every ``args`` in ``cases``;
    each result must be the number ``expected(*args)``. The first call
    that raises or is wrong is the hint (``mistakes(*args)`` lists the
    wrong numbers catalogued mistakes give; ``refuse(record)`` names a
    forbidden way of computing it)."""
    for args in cases:
        call = attempt(fn, *args)
        if call.verdict is not None:
            return call.verdict
        forbidden = refuse(call.record) if refuse else None
        if forbidden is not None:
            return forbidden.verdict(call.label)
        verdict = check_number(
            call.label, call.value, expected(*args),
            mistakes=mistakes(*args) if mistakes else ())
        if verdict is not None:
            return verdict
    return Verdict(True, success)


def passed(problem: Verdict | None, success: str) -> Verdict:
    """``Correct: success`` when there is no ``problem``, else it."""
    return Verdict(True, success) if problem is None else problem
