"""Checkers for chapter 17's exercises (sliding windows, ALiBi,
FlexAttention)."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch

from mha_lib.alibi import alibi_slopes
from mha_lib.exercises.verdict import (
    Verdict,
    attempt,
    catalogue,
    check_calls,
    check_tensor,
)
from mha_lib.masks import sliding_window_mask

__all__ = ["check_window_mask_mod", "check_alibi_slopes",
           "check_receptive_field", "check_softcap_score_mod"]

_WINDOW = "Sliding-window attention"
_FLEX = "FlexAttention: masks and biases as functions"
_ALIBI = "ALiBi: a bias instead of positions"

WINDOW = catalogue(
    "check_window_mask_mod", 17,
    one_too_many=("each query sees one key too many: the window counts "
                  "the query itself, q_idx - kv_idx < window", _WINDOW),
    one_too_few=("each query sees one key too few: the window counts the "
                 "query itself, so q_idx - kv_idx < window (not "
                 "window - 1)", _WINDOW),
    future=("the queries see the future: add the causal part "
            "q_idx >= kv_idx", _WINDOW),
    both_sides=("that window reaches both ways, |q_idx - kv_idx| < window: "
                "a decoder's query must not see later keys, so require "
                "q_idx >= kv_idx", _WINDOW),
    no_window=("that is plain causal attention, every earlier key: the "
               "window is missing (or its distance has the sign reversed, "
               "kv_idx - q_idx < window, which every earlier key meets); "
               "add q_idx - kv_idx < window", _WINDOW),
    reversed_sign=("the distance has its sign reversed: kv_idx - q_idx < "
                   "window holds for every earlier key; the query at "
                   "q_idx is kv_idx <= q_idx, so q_idx - kv_idx < window",
                   _WINDOW),
    transposed=("query and key are swapped: the query at q_idx sees the "
                "keys at q_idx - window + 1 .. q_idx, so kv_idx <= q_idx",
                _FLEX),
    inverted=("the mask is True where a key is hidden; a mask_mod returns "
              "True where the query may attend", _FLEX),
    strict=("the query does not see itself: the window counts the query "
            "at q_idx, so q_idx >= kv_idx (not >) and q_idx - kv_idx < "
            "window", _WINDOW),
    python_and=("The indices are tensors: combine the two conditions with "
                "&, not Python's and", _FLEX),
)


def _explain_window(error: BaseException, record) -> object:
    return WINDOW["python_and"] if "ambiguous" in str(error) else None


def _not_a_function(made, signature: str) -> Verdict:
    """The verdict on a maker that returned something not callable."""
    return Verdict(False, f"{made.label} should return a function "
                          f"{signature}, got {type(made.value).__name__}")


def check_window_mask_mod(fn: Callable[[int], Callable]) -> Verdict:
    """Exercise 17.1: ``fn(window)`` returns a FlexAttention ``mask_mod(b,
    h, q_idx, kv_idx)`` (True = may attend) equal to
    :func:`~mha_lib.sliding_window_mask` for a square mask."""
    for length, window in ((6, 3), (9, 1), (5, 5), (8, 20), (7, 2)):
        i = torch.arange(length)[:, None]  # (L, 1) query positions
        j = torch.arange(length)[None, :]  # (1, L) key positions
        zero = torch.zeros((), dtype=torch.long)
        made = attempt(fn, window)
        if made.verdict is not None:
            return made.verdict
        if not callable(made.value):
            return _not_a_function(made, "mask_mod(b, h, q_idx, kv_idx)")
        call = attempt(made.value, zero, zero, i, j,
                       shown="b, h, q_idx, kv_idx", explain=_explain_window)
        if call.verdict is not None:
            return Verdict(False, f"the mask_mod of {made.label}: "
                                  f"{call.verdict.message}")
        expected = sliding_window_mask(length, window)
        past = torch.ones_like(expected)
        itself = torch.eye(length, dtype=torch.bool)
        problem = check_tensor(
            f"the mask_mod of {made.label} on {length} positions",
            call.value, expected, axes="(Lq, Lk)", mistakes=[
                (WINDOW["inverted"], ~expected),
                (WINDOW["one_too_many"],
                 sliding_window_mask(length, window + 1)),
                (WINDOW["one_too_few"],
                 partial(sliding_window_mask, length, window - 1)),
                (WINDOW["future"], past.triu(-(window - 1))),
                (WINDOW["both_sides"], expected | expected.T),
                (WINDOW["transposed"], expected.T),
                (WINDOW["no_window"], past.tril()),
                (WINDOW["reversed_sign"], past.tril(window - 1)),
                (WINDOW["strict"], expected & ~itself),  # q > kv, < W
                (WINDOW["strict"],  # q > kv, <= W
                 sliding_window_mask(length, window + 1) & ~itself),
            ])
        if problem is not None:
            return problem
    return Verdict(True, "(q_idx >= kv_idx) & (q_idx - kv_idx < window), "
                         "the library's sliding_window_mask")


SLOPES = catalogue(
    "check_alibi_slopes", 17,
    naive=("that is 2^(-8/H) for H not a power of two; the authors' "
           "code (get_slopes) takes the nearest smaller power of two, "
           "then every other slope of twice as many heads", _ALIBI),
    ascending=("the slopes should fall from head to head: head 0 gets the "
               "largest, 2^(-8/H)", _ALIBI),
    sorted=("the right slopes, in the wrong order: for H not a power of "
            "two the extra heads come after the first p (their slopes "
            "fall between those of the first p); sorting them from "
            "steep to shallow gives heads other slopes", _ALIBI),
    odd_extra=("the extra heads take slopes 0, 2, 4, ... of twice as many "
               "heads ([0::2]), not 1, 3, 5, ...", _ALIBI),
    negative=("the slopes are positive; the bias is -slope * distance",
              _ALIBI),
    from_zero=("the first slope is 2^(-8/H), not 2^0 = 1: the exponent "
               "is -8 (h + 1) / H for h = 0, 1, ..., not -8 h / H", _ALIBI),
    halves=("that is 1/2, 1/4, 1/8, ... whatever H, right for 8 heads "
            "only: the slopes are 2^(-8 (h + 1) / H), so their ratio "
            "depends on H", _ALIBI),
    half=("the values are right but stored in a 16-bit dtype, float16 "
          "or bfloat16, which keeps only 11 or 8 significant bits: "
          "return float32 (or a list of Python floats)", _ALIBI),
)


def _power_of_two(n: int) -> list[float]:
    return [2.0 ** (-8 * (h + 1) / n) for h in range(n)]


def _from_zero(num_heads: int) -> list[float]:
    # The recipe with every geometric sequence started at 2^0 = 1.
    p = 2 ** math.floor(math.log2(num_heads))
    shifted = [2.0 ** (-8 * h / p) for h in range(p)]
    twice = [2.0 ** (-8 * h / (2 * p)) for h in range(2 * p)]
    return shifted + twice[0::2][:num_heads - p]


def _odd_extra(num_heads: int) -> list[float]:
    p = 2 ** math.floor(math.log2(num_heads))
    return _power_of_two(p) + _power_of_two(2 * p)[1::2][:num_heads - p]


def check_alibi_slopes(fn: Callable[[int], list[float]]) -> Verdict:
    """Exercise 17.2: ``fn(num_heads)`` is the list of ALiBi's head
    slopes, also for a number of heads that is not a power of two."""
    for num_heads in (8, 6, 16, 1, 4, 12, 20):
        call = attempt(fn, num_heads)
        if call.verdict is not None:
            return call.verdict
        half = isinstance(call.value, torch.Tensor) and (
            call.value.dtype in (torch.float16, torch.bfloat16))
        if half and call.value.shape == (num_heads,) and torch.allclose(
                call.value.double(), torch.tensor(
                    alibi_slopes(num_heads), dtype=torch.float64),
                atol=0, rtol=4e-3):  # bfloat16 keeps 8 bits: 2^-8
            return SLOPES["half"].verdict(call.label)
        try:
            given = torch.as_tensor(call.value, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError):
            return Verdict(False, f"{call.label} should be a list of "
                                  f"numbers, got {call.value!r:.60}")
        expected = torch.tensor(alibi_slopes(num_heads),
                                dtype=torch.float64)
        # float32 (torch.arange, torch.tensor) is right: 6e-8 rounding
        near = given.shape == expected.shape and torch.allclose(
            given, expected, atol=0, rtol=1e-3)
        if near and not torch.allclose(given, expected, atol=0,
                                       rtol=1e-6):
            worst = float(((given - expected) / expected).abs().max())
            return Verdict(False, f"{call.label} is close to the slopes, "
                                  f"but up to {worst:.1e} off relative to "
                                  f"them, more than float32 rounding: "
                                  f"check the exponents, -8 (h + 1) / H")
        problem = check_tensor(
            call.label, given, expected, axes="(H,)", atol=0,
            rtol=1e-6, mistakes=[
                (SLOPES["naive"],
                 torch.tensor(_power_of_two(num_heads),
                              dtype=torch.float64)),
                (SLOPES["ascending"], expected.flip(0)),
                (SLOPES["ascending"], expected.sort().values),
                (SLOPES["sorted"],
                 expected.sort(descending=True).values),
                (SLOPES["odd_extra"],
                 torch.tensor(_odd_extra(num_heads), dtype=torch.float64)),
                (SLOPES["negative"], -expected),
                (SLOPES["halves"], torch.tensor(
                    [2.0 ** -(h + 1) for h in range(num_heads)],
                    dtype=torch.float64)),
                (SLOPES["from_zero"],
                 torch.tensor(_from_zero(num_heads), dtype=torch.float64)),
            ])
        if problem is not None:
            return problem
    return Verdict(True, "2^(-8/H), 2^(-16/H), ...; for other H, the "
                         "slopes of the nearest smaller power of two and "
                         "every other slope of twice that")


REACH = catalogue(
    "check_receptive_field", 17,
    window_per_layer=("each layer reaches window - 1 positions further "
                      "back, not window: the window counts the query "
                      "itself", _WINDOW),
    one_layer=("the layers chain: each one reaches window - 1 further back "
               "than the one below", _WINDOW),
    counts_itself=("count the positions before the last token, not the "
                   "token itself", _WINDOW),
    power=("window ** num_layers counts paths, not positions: the "
           "layers add their reach, window - 1 each, they do not "
           "multiply it", _WINDOW),
    query_once=("num_layers * window - 1 takes the query out once; every "
                "layer's window counts its own query, so each layer "
                "reaches window - 1 back: num_layers * (window - 1)",
                _WINDOW),
)


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

    def wrong(window: int, num_layers: int) -> list:
        right = expected(window, num_layers)
        return [(REACH["window_per_layer"], num_layers * window),
                (REACH["one_layer"], window - 1),
                (REACH["counts_itself"], right + 1),
                (REACH["query_once"], num_layers * window - 1),
                (REACH["power"], window ** num_layers)]

    cases = [(4, 3), (3, 1), (3, 2), (1, 5), (10, 4)]
    return check_calls(fn, cases, expected,
                       "each layer reaches window - 1 positions further "
                       "back: num_layers * (window - 1)", mistakes=wrong)


SOFTCAP = catalogue(
    "check_softcap_score_mod", 17,
    uncapped=("the scores come back unchanged: return cap * torch.tanh("
              "score / cap)", _FLEX),
    no_divide=("that is cap * tanh(score): divide by the cap inside the "
               "tanh, cap * tanh(score / cap), so that a small score "
               "passes almost unchanged", _FLEX),
    cancelled=("that is tanh(score), squeezed into (-1, 1) (so is cap * "
               "tanh(score) / cap: the cap cancels); divide inside the "
               "tanh and multiply outside: cap * torch.tanh(score / cap)",
               _FLEX),
    no_multiply=("that is tanh(score / cap), squeezed into (-1, 1): "
                 "multiply by the cap again", _FLEX),
    clamp=("that clips the scores at -cap and cap, a hard cap; the soft "
           "cap bends them smoothly: cap * torch.tanh(score / cap)",
           _FLEX),
    scaled_again=("the score a score_mod receives is already "
                  "q . k / sqrt(D): do not scale it again (by sqrt(D), "
                  "D or any other factor)", _FLEX),
    math_tanh=("math.tanh takes one Python number, but score is a tensor "
               "(flex_attention calls the score_mod on all the scores at "
               "once): use torch.tanh", _FLEX),
)

# What math.tanh (or float()) on the score tensor raises inside
# flex_attention: a guard on a data-dependent value, or a conversion.
_PYTHON_MATH = ("data-dependent", "real number", "python scalar")


def check_softcap_score_mod(fn: Callable[[float], Callable]) -> Verdict:
    """Exercise 17.4: ``fn(cap)`` returns a FlexAttention ``score_mod(
    score, b, h, q_idx, kv_idx)`` for Gemma 2's soft-capping of the
    scores, ``cap * tanh(score / cap)``; checked through eager
    ``flex_attention`` against the dense computation."""
    import warnings

    from torch.nn.attention.flex_attention import flex_attention

    generator = torch.Generator().manual_seed(17)
    # (B, H, L, D) with scores up to about 10, beyond the caps below
    q, k, v = torch.randn(3, 1, 2, 6, 8, generator=generator).unbind(0)
    q = 4 * q
    for cap in (2.0, 5.0):
        made = attempt(fn, cap)
        if made.verdict is not None:
            return made.verdict
        if not callable(made.value):
            return _not_a_function(
                made, "score_mod(score, b, h, q_idx, kv_idx)")

        def flex_attention_with_your_score_mod(score_mod=made.value):
            with warnings.catch_warnings():
                warnings.filterwarnings(
                    "ignore", message=".*without torch.compile")
                return flex_attention(q, k, v, score_mod=score_mod)

        call = attempt(flex_attention_with_your_score_mod, shown="")
        if call.verdict is not None and any(
                word in str(call.error).lower() for word in _PYTHON_MATH):
            return SOFTCAP["math_tanh"].verdict(
                f"the score_mod of {made.label}")
        if call.verdict is not None:
            return Verdict(False, f"the score_mod of {made.label}: "
                                  f"{call.verdict.message}")
        scores = q @ k.mT / math.sqrt(q.size(-1))  # (B, H, L, L)

        def out(s: torch.Tensor) -> torch.Tensor:
            return torch.softmax(s, dim=-1) @ v  # (B, H, L, D)

        problem = check_tensor(
            f"flex_attention with the score_mod of {made.label}",
            call.value, out(cap * torch.tanh(scores / cap)),
            axes="(B, H, L, D)", mistakes=[
                (SOFTCAP["uncapped"], out(scores)),
                (SOFTCAP["no_divide"], out(cap * torch.tanh(scores))),
                (SOFTCAP["no_multiply"], out(torch.tanh(scores / cap))),
                (SOFTCAP["cancelled"], out(torch.tanh(scores))),
                (SOFTCAP["clamp"], out(scores.clamp(-cap, cap))),
                (SOFTCAP["scaled_again"], out(cap * torch.tanh(
                    scores / math.sqrt(q.size(-1)) / cap))),
                (SOFTCAP["scaled_again"], out(cap * torch.tanh(
                    scores / q.size(-1) / cap))),
            ])
        if problem is not None:
            return problem
    return Verdict(True, "cap * torch.tanh(score / cap): Gemma 2's soft "
                         "cap, with cap = 50")
