"""Checkers for chapter 3's exercises (positional encoding)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from mha_lib.exercises.verdict import (
    Verdict,
    attempt,
    catalogue,
    check_tensor,
    source_names,
)
from mha_lib.positional import sinusoidal_encoding

__all__ = ["check_sinusoidal", "check_shift_matrix", "check_ahead_matrix"]

_FORMULA = "The sinusoidal formula"

SINUSOIDAL = catalogue(
    "check_sinusoidal", 3,
    exp_log=("right numbers, computed with exp and log (or by the "
             "library, which uses them); now write them in the power "
             "form the exercise asks for: the positions divided by "
             "10000 ** (2 * i / d_model)", _FORMULA),
    concatenated=("the sines and cosines are concatenated (all sines, "
                  "then all cosines); the formula interleaves them: sin "
                  "in the even columns 0, 2, ..., cos in the odd ones",
                  _FORMULA),
    swapped=("sin and cos are swapped: column 2i holds the sine, column "
             "2i + 1 the cosine", _FORMULA),
    exponent_i=("the exponent is 2i / d_model with i the pair index "
                "0 .. d_model/2 - 1; i / d_model makes the frequencies "
                "fall too slowly", _FORMULA),
    exponent_4i=("torch.arange(0, d_model, 2) already holds 2i: doubling "
                 "it again makes the frequencies fall too fast", _FORMULA),
    column_index=("the exponent uses the column index j, so the cosine "
                  "in column 2i + 1 gets (2i + 1) / d_model: a sine and "
                  "its cosine share one frequency, 10000 ** (2i / "
                  "d_model) with i the pair index", _FORMULA),
    column_index_2j=("the exponent uses the column index j as if it "
                     "were the pair index: 2j / d_model gives column 2i "
                     "the exponent 4i / d_model and its cosine (4i + 2) "
                     "/ d_model, so every pair turns at two wrong "
                     "frequencies; use i = j // 2, the pair index, "
                     "10000 ** (2i / d_model) for both columns",
                     _FORMULA),
    integer_division=("2 * i // d_model is integer division: it is 0 for "
                      "every pair, so all pairs turn at frequency 1; "
                      "write 2 * i / d_model", _FORMULA),
    fairseq=("the frequencies are spaced as 10000 ** (-i / (d_model/2 "
             "- 1)), fairseq's variant, so that the slowest is exactly "
             "1/10000; the paper's formula divides by 10000 ** (2i / "
             "d_model)", _FORMULA),
    floor_division=("the positions are floor-divided (//): pos // "
                    "10000 ** (...) rounds every angle down to a whole "
                    "number; write pos / 10000 ** (2 * i / d_model)",
                    _FORMULA),
    multiplied=("the positions are multiplied by 10000 ** (2i / d_model); "
                "they are divided by it", _FORMULA),
    from_one=("the positions start at 1; they start at 0, so row 0 is "
              "(0, 1, 0, 1, ...)", _FORMULA),
    half=("the table is in half precision, which keeps about 3 "
          "digits; compute and return it in float32, the dtype of "
          "torch.arange(...) / 10000.0 ** ...", _FORMULA),
    hard_coded=("it fits the running example only: a size is written as "
                "a number (6 positions or d_model = 8); build the table "
                "from the arguments length and d_model", _FORMULA),
)


def _table(length: int, d_model: int, exponent: float = 2.0,
           divide: bool = True, start: int = 0,
           layout: str = "interleaved") -> torch.Tensor:
    """The sinusoidal table, or one of its usual wrong versions."""
    i = torch.arange(d_model // 2, dtype=torch.float64)  # pair index
    power = 10000.0 ** (exponent * i / d_model)  # (d_model/2,)
    if layout == "fairseq":  # 10000 ** (i / (d_model/2 - 1))
        power = 10000.0 ** (i / max(d_model // 2 - 1, 1))
    pos = torch.arange(start, start + length,
                       dtype=torch.float64)[:, None]  # (L, 1)
    angles = pos / power if divide else pos * power  # (L, d_model/2)
    if layout == "floor":  # pos // power
        angles = torch.div(pos, power, rounding_mode="floor")
    sin, cos = angles.sin(), angles.cos()
    if layout == "column_index":  # cos column 2i + 1: (2i + 1) / d_model
        cos = (pos / 10000.0 ** ((2 * i + 1) / d_model)).cos()
    if layout == "column_index_2j":  # column j: 2j / d_model
        sin = (pos / 10000.0 ** (4 * i / d_model)).sin()
        cos = (pos / 10000.0 ** ((4 * i + 2) / d_model)).cos()
    if layout == "concatenated":
        return torch.cat([sin, cos], dim=-1).float()
    if layout == "swapped":
        sin, cos = cos, sin
    return torch.stack([sin, cos], dim=-1).flatten(-2).float()


def check_sinusoidal(fn: Callable[[int, int], torch.Tensor]) -> Verdict:
    """Exercise 3.1: ``fn(length, d_model)`` returns the sinusoidal table of
    :func:`~mha_lib.sinusoidal_encoding`, computed with the power
    ``10000 ** (2 * i / d_model)`` (no ``exp`` and ``log``)."""
    names = source_names(fn)
    shortcut = None  # the first call that used exp and log, if any
    for length, d_model in ((6, 8), (1, 2), (50, 16), (100, 64)):
        call = attempt(fn, length, d_model)
        if call.verdict is not None:
            return call.verdict
        if shortcut is None and (
                call.record.used(torch.exp, torch.Tensor.exp, torch.log,
                                 torch.Tensor.log)
                or names & {"exp", "log", "sinusoidal_encoding",
                            "PositionalEncoding"}):
            shortcut = call.label
        value = call.value
        if isinstance(value, torch.Tensor) and value.dtype in (
                torch.float16, torch.bfloat16):
            return SINUSOIDAL["half"].verdict(
                f"{call.label} returned {value.dtype}")
        size = (length, d_model)
        if (isinstance(value, torch.Tensor) and value.dim() == 2
                and tuple(value.shape) != size
                and ((value.shape[1] == 8 and d_model != 8)
                     or (value.shape[0] == 6 and length != 6))):
            return SINUSOIDAL["hard_coded"].verdict(
                f"{call.label} returned shape {tuple(value.shape)}")
        # Other ways of computing 10000^(2i/d) differ in the last bits;
        # angles up to 99 turn that into differences of about 1e-5, so
        # allow 1e-4.
        problem = check_tensor(
            call.label, call.value, sinusoidal_encoding(length, d_model),
            axes="(length, d_model)", atol=1e-4, rtol=0.0, mistakes=[
                (SINUSOIDAL["concatenated"],
                 partial(_table, *size, layout="concatenated")),
                (SINUSOIDAL["swapped"],
                 partial(_table, *size, layout="swapped")),
                (SINUSOIDAL["exponent_i"], partial(_table, *size, 1.0)),
                (SINUSOIDAL["exponent_4i"], partial(_table, *size, 4.0)),
                (SINUSOIDAL["column_index"],
                 partial(_table, *size, layout="column_index")),
                (SINUSOIDAL["column_index_2j"],
                 partial(_table, *size, layout="column_index_2j")),
                (SINUSOIDAL["integer_division"],
                 partial(_table, *size, 0.0)),
                (SINUSOIDAL["fairseq"],
                 partial(_table, *size, layout="fairseq")),
                (SINUSOIDAL["floor_division"],
                 partial(_table, *size, layout="floor")),
                (SINUSOIDAL["multiplied"],
                 partial(_table, *size, divide=False)),
                (SINUSOIDAL["from_one"], partial(_table, *size, start=1)),
            ])
        if problem is not None:
            return problem
    if shortcut is not None:  # the right numbers, not yet the power form
        return SINUSOIDAL["exp_log"].verdict(shortcut)
    return Verdict(
        True,
        "the same table as mha_lib.sinusoidal_encoding for four sizes")


_ROTATION = "Why sines and cosines: relative positions"

SHIFT = catalogue(
    "check_shift_matrix", 3,
    backwards=("M moves the positions back, not on: the sines of each "
               "block have the wrong signs (you may have built the "
               "transpose, for column vectors, M @ PE[pos]^T)",
               _ROTATION),
    one_step=("M moves every position 1 step on; the rotation angle of "
              "pair i is omega_i times k", _ROTATION),
    exponent_i=("the frequencies are off: omega_i = 10000 ** (-2i / "
                "d_model) with i the pair index", _ROTATION),
    not_block_diagonal=("M mixes different pairs: each sin/cos pair needs "
                        "its own 2 x 2 rotation, with zeros elsewhere",
                        _ROTATION),
    not_inverted=("the angles grow with i: omega_i = 10000 ** (-2i / "
                  "d_model) has a minus sign, so the later pairs turn "
                  "more slowly, not faster", _ROTATION),
    integer_division=("every pair turns by the same angle, k radians: "
                      "omega_i came out as 1 for every pair (if you "
                      "wrote 2 * i // d_model, that integer division "
                      "is 0 for every i; write 2 * i / d_model)",
                      _ROTATION),
    other_width=("those are the frequencies of d_model = 64 (the "
                 "chapter's check used omega64); the exercise's table "
                 "has d_model = 8, omega_i = 10000 ** (-2i / 8)",
                 _ROTATION),
    fitted_few=("M moves the first few positions correctly but not the "
                "later ones: a fit on fewer positions than d_model "
                "does not pin M down; fit on many positions, or build "
                "the rotations from the formula", _ROTATION),
    identity=("M is the identity: it leaves every position where it "
              "is; pair i must turn by omega_i times k", _ROTATION),
    reversed_frequencies=("the frequencies are in reverse order: pair 0 "
                          "must turn fastest (omega_0 = 1) and the last "
                          "pair slowest", _ROTATION),
)


def _shift(k: float, d_model: int, exponent: float = 2.0,
           flip: bool = False) -> torch.Tensor:
    """The block-diagonal matrix that moves every position ``k`` on,
    ``PE[pos + k] = PE[pos] @ M`` (with ``flip``, its pairs' frequencies
    in reverse order)."""
    i = torch.arange(d_model // 2, dtype=torch.float64)
    if flip:
        i = i.flip(0)
    angle = k * 10000.0 ** (-exponent * i / d_model)  # (d_model/2,)
    c, s = angle.cos(), angle.sin()
    blocks = [torch.tensor([[c[j], -s[j]], [s[j], c[j]]])
              for j in range(d_model // 2)]
    return torch.block_diag(*blocks).float()


def _not_square(name: str, given: object, d_model: int) -> Verdict | None:
    """The verdict on a matrix argument that is not a (d_model, d_model)
    tensor; None when it is one."""
    if not isinstance(given, torch.Tensor):
        return Verdict(
            False, f"{name} should be a tensor, got {type(given).__name__}")
    if given.shape != (d_model, d_model):
        return Verdict(
            False, f"{name}: expected shape (d_model, d_model) = "
                   f"{(d_model, d_model)}, got {tuple(given.shape)}")
    return None


def check_shift_matrix(
    M: torch.Tensor, k: int = 3, d_model: int = 8
) -> Verdict:
    """Exercise 3.2: a ``(d_model, d_model)`` matrix with
    ``PE[pos + k] = PE[pos] @ M`` (rows) for every position, the same
    matrix for all of them."""
    pe = sinusoidal_encoding(64 + k, d_model)  # (L + k, d_model)
    if (wrong := _not_square("M", M, d_model)) is not None:
        return wrong
    # row pos holds PE[pos] @ M; 1e-3 on entries of size 1 leaves room
    # for a least-squares fit, whose slow pairs are ill-conditioned
    shifted = pe[:-k] @ M.detach().to(pe.dtype)
    problem = check_tensor(
        f"PE[pos] @ M for pos = 0..63 (compared with PE[pos + {k}])",
        shifted, pe[k:], atol=1e-3, rtol=0.0)
    if problem is None:
        return Verdict(
            True, f"one matrix moves every position {k} steps on, a "
                  "rotation per pair")
    given = M.detach().float()
    for mistake, wrong in (
            (SHIFT["identity"], torch.eye(d_model)),
            (SHIFT["reversed_frequencies"], _shift(k, d_model, flip=True)),
            (SHIFT["backwards"], _shift(-k, d_model)),
            (SHIFT["one_step"], _shift(1, d_model)),
            (SHIFT["exponent_i"], _shift(k, d_model, 1.0)),
            (SHIFT["not_inverted"], _shift(k, d_model, -2.0)),
            (SHIFT["integer_division"], _shift(k, d_model, 0.0)),
            # omega_i of d_model = 64: 10000 ** (-2i / 64)
            (SHIFT["other_width"], _shift(k, d_model, 2.0 * d_model / 64))):
        if torch.allclose(given, wrong, atol=1e-4):
            return mistake.verdict("M")
    # right on the first positions (those a small fit used), wrong later
    if torch.allclose(shifted[:2], pe[k:k + 2], atol=1e-3):
        return SHIFT["fitted_few"].verdict("M")
    pairs = torch.block_diag(*[torch.ones(2, 2)] * (d_model // 2))
    scale = given.abs().max().clamp(min=1.0)  # a rotation's entries: <= 1
    if (given * (1 - pairs)).abs().max() > 1e-3 * scale:
        return SHIFT["not_block_diagonal"].verdict("M")
    return problem


_AHEAD = "Why sines and cosines: relative positions"

AHEAD = catalogue(
    "check_ahead_matrix", 3,
    dot_product=("every position scores itself highest, like "
                 "the plain dot product PE_p . PE_q (W = I); and that "
                 "dot product cannot tell ahead from behind. Let W "
                 "move PE_p one step on first", _AHEAD),
    behind=("every position prefers the previous one, p - 1: "
            "with M the one-step matrix (PE[p + 1] = PE[p] @ M), "
            "PE_p M^T PE_q^T = PE_p . PE[q + 1]; use M itself, "
            "PE_p M PE_q^T = PE[p + 1] . PE_q", _AHEAD),
    other_offset=("every position prefers another offset than + 1: "
                  "the rotation of pair i must be by omega_i times 1, "
                  "one step", _AHEAD),
)


def check_ahead_matrix(W: torch.Tensor, d_model: int = 8) -> Verdict:
    """Exercise 3.3: a ``(d_model, d_model)`` matrix with which the score
    ``PE_p W PE_q^T`` is highest at ``q = p + 1`` for every position
    ``p`` of a 64-row table (``p = 0 .. 62``)."""
    if (wrong := _not_square("W", W, d_model)) is not None:
        return wrong
    pe = sinusoidal_encoding(64, d_model).double()  # (L, d_model)
    scores = pe @ W.detach().double() @ pe.T  # (L, L): PE_p W PE_q^T
    favourite = scores[:-1].argmax(dim=-1)  # (L - 1,): best q for p
    offset = favourite - torch.arange(63)  # q - p
    if bool((offset == 1).all()):
        return Verdict(
            True, "every position p = 0..62 scores p + 1 highest: W "
                  "tells ahead from behind")
    inner = offset[4:-4]  # p = 4 .. 58: away from both ends
    if bool((inner == 0).all()):
        return AHEAD["dot_product"].verdict("W")
    if bool((inner == -1).all()):
        return AHEAD["behind"].verdict("W")
    if bool((inner == inner[0]).all()):
        return AHEAD["other_offset"].verdict(
            f"W (offset {int(inner[0])})")
    p = int((offset != 1).nonzero()[0])
    return Verdict(
        False, f"W: position {p} scores q = {int(favourite[p])} highest, "
               f"not q = {p + 1}; the score PE_p W PE_q^T should be "
               "largest one step ahead for every p")
