"""Checkers for chapter 17's exercises (sliding windows, ALiBi,
FlexAttention)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from mha_lib.alibi import alibi_slopes
from mha_lib.exercises.verdict import (
    Mistake,
    Verdict,
    attempt,
    catalogue,
    check_tensor,
)

__all__ = ["check_document_window_mod", "check_alibi_slopes",
           "check_bidirectional_alibi", "check_softcap_score_mod",
           "check_ring_held", "check_reach_inputs"]

_WINDOW = "Sliding-window attention"
_FLEX = "FlexAttention: masks and biases as functions"
_ALIBI = "ALiBi: a bias instead of positions"

DOC_WINDOW = catalogue(
    "check_document_window_mod", 17,
    one_too_many=("each query sees one key too many: the window counts "
                  "the query itself, q_idx - kv_idx < window (not <=)",
                  _WINDOW),
    one_too_few=("each query sees one key too few: the window counts the "
                 "query itself, so q_idx - kv_idx < window (not "
                 "window - 1)", _WINDOW),
    future=("the queries see later keys of their document (a window "
            "reaching both ways, or none back): add the causal part "
            "q_idx >= kv_idx", _WINDOW),
    forward=("the window looks forward: each query sees itself and the "
             "window - 1 later keys of its document; it should see the "
             "earlier ones, q_idx >= kv_idx and q_idx - kv_idx < window",
             _WINDOW),
    leak=("the window reaches across a document boundary: a query may "
          "attend only keys of its own document, document_id[q_idx] == "
          "document_id[kv_idx]", _FLEX),
    no_window=("that is the page's document mask, every earlier key of "
               "the document: the window removes no key, either missing "
               "or written the wrong way round (kv_idx - q_idx is never "
               "positive for an earlier key); the distance back is "
               "q_idx - kv_idx < window", _FLEX),
    inverted=("the mask is True where a key is hidden; a mask_mod returns "
              "True where the query may attend", _FLEX),
    strict=("the query must see itself: q_idx > kv_idx drops the "
            "diagonal; the causal part is q_idx >= kv_idx (the window "
            "counts the query itself)", _WINDOW),
    python_and=("The indices are tensors: combine the conditions with &, "
                "not Python's and", _FLEX),
    or_for_and=("the conditions are joined with | (or), so a key passes "
                "when any one holds; it must pass all three (its document, "
                "not later, within the window): join them with &", _FLEX),
    batch_index=("document_id is 1-D, one document per position: index it "
                 "with the positions alone, document_id[q_idx] (the "
                 "page's doc is (B, L), hence its doc[b, q_idx])", _FLEX),
    by_batch=("the document is looked up at b, the batch index (0 here), "
              "not at the query: compare document_id[q_idx] with "
              "document_id[kv_idx]; b picks a row of the page's (B, L) "
              "doc, and document_id has one row", _FLEX),
    fixed_window=("the mask is the same for every window: use the window "
                  "argument you were given, not a fixed number", _WINDOW),
    other_tensor=("the mask does not change with the document_id you "
                  "were given: it closes over another tensor (the page's "
                  "doc?); look up document_id[q_idx] and "
                  "document_id[kv_idx]", _FLEX),
)


def _mask_of(fn: Callable, ids: list[int], window: int,
             length: int) -> torch.Tensor | None:
    """The bool (L, L) mask of ``fn(document_id, window)``, or None when
    the reader's code fails or gives something else (reported later)."""
    i = torch.arange(length)[:, None]
    j = torch.arange(length)[None, :]
    zero = torch.zeros((), dtype=torch.long)
    try:
        mask = fn(torch.tensor(ids), window)(zero, zero, i, j)
    except Exception:  # the reader's error: the main check reports it
        return None
    ok = isinstance(mask, torch.Tensor) and mask.shape == (length, length)
    return mask.bool() if ok else None


def _expected_doc_window(ids: list[int], window: int) -> torch.Tensor:
    p = torch.arange(len(ids))[:, None]
    k = torch.arange(len(ids))[None, :]
    doc = torch.tensor(ids)
    same = doc[:, None] == doc[None, :]
    return same & (p >= k) & (p - k < window)


def _ignored_argument(fn: Callable, ids: list[int], window: int,
                      given: torch.Tensor) -> Mistake | None:
    """A wrong mask that stays the same when the window, or the document
    ids, change where the right one would not."""
    length = len(ids)
    for other in (window + 2, max(window - 1, 1)):
        if torch.equal(_expected_doc_window(ids, other),
                       _expected_doc_window(ids, window)):
            continue
        moved = _mask_of(fn, ids, other, length)
        if moved is not None and torch.equal(moved, given):
            return DOC_WINDOW["fixed_window"]
    one_doc = [0] * length  # the same positions, a single document
    if not torch.equal(_expected_doc_window(one_doc, window),
                       _expected_doc_window(ids, window)):
        moved = _mask_of(fn, one_doc, window, length)
        gap = torch.arange(length)[:, None] - torch.arange(length)
        leak = (gap >= 0) & (gap < window)  # no document test at all
        if (moved is not None and torch.equal(moved, given)
                and not torch.equal(given, leak)):
            return DOC_WINDOW["other_tensor"]
    return None


def _explain_and(error: BaseException, record) -> object:
    if "ambiguous" in str(error):
        return DOC_WINDOW["python_and"]
    if isinstance(error, IndexError) and "too many indices" in str(error):
        return DOC_WINDOW["batch_index"]
    return None


def _not_a_function(made, signature: str) -> Verdict:
    """The verdict on a maker that returned something not callable."""
    return Verdict(False, f"{made.label} should return a function "
                          f"{signature}, got {type(made.value).__name__}")


def check_document_window_mod(
        fn: Callable[[torch.Tensor, int], Callable]) -> Verdict:
    """Exercise 17.1: ``fn(document_id, window)`` returns a FlexAttention
    ``mask_mod(b, h, q_idx, kv_idx)`` (True = may attend) for packed
    documents under a sliding window: a query sees the keys of its own
    document that the causal window of ``window`` positions allows."""
    cases = (([0] * 5 + [1] * 3 + [2] * 4, 3), ([0] * 2 + [1] * 6, 4),
             ([0, 1, 1, 2, 2, 2, 3], 2), ([0] * 4 + [1] * 5, 1),
             ([0] * 6 + [1] * 6, 20))
    for ids, window in cases:
        document_id = torch.tensor(ids)  # (L,) each token's document
        length = len(ids)
        i = torch.arange(length)[:, None]  # (L, 1) query positions
        j = torch.arange(length)[None, :]  # (1, L) key positions
        zero = torch.zeros((), dtype=torch.long)
        made = attempt(fn, document_id.clone(), window,
                       shown=f"document_id {ids}, {window}")
        if made.verdict is not None:
            return made.verdict
        if not callable(made.value):
            return _not_a_function(made, "mask_mod(b, h, q_idx, kv_idx)")
        call = attempt(made.value, zero, zero, i, j,
                       shown="b, h, q_idx, kv_idx", explain=_explain_and)
        if call.verdict is not None:
            return Verdict(False, f"the mask_mod of {made.label}: "
                                  f"{call.verdict.message}")
        # the reference, pair by pair: same document, earlier, near
        same = torch.tensor([[a == b for b in ids] for a in ids])
        gap = torch.tensor([[p - k for k in range(length)]
                            for p in range(length)])  # (L, L): p - k
        past = gap >= 0
        expected = _expected_doc_window(ids, window)
        given = call.value
        near = gap < window
        joined_by_or = (same | (past & near), same | past | near,
                        (same | past) & near, same & (past | near))
        if (isinstance(given, torch.Tensor)
                and given.shape == expected.shape
                and not torch.equal(given.bool(), expected)
                and any(torch.equal(given.bool(), wrong)
                        for wrong in joined_by_or)):
            return DOC_WINDOW["or_for_and"].verdict(
                f"the mask_mod of {made.label}")
        if (isinstance(given, torch.Tensor)
                and given.shape == expected.shape
                and given.dtype == torch.bool
                and not torch.equal(given, expected)
                and not torch.equal(given, same & past)):  # no_window
            ignored = _ignored_argument(fn, ids, window, given)
            if ignored is not None:
                return ignored.verdict(f"the mask_mod of {made.label}")
        problem = check_tensor(
            f"the mask_mod of {made.label}", call.value, expected,
            axes="(Lq, Lk)", mistakes=[
                (DOC_WINDOW["inverted"], ~expected),
                (DOC_WINDOW["one_too_many"],
                 same & past & (gap < window + 1)),
                (DOC_WINDOW["one_too_few"],
                 same & past & (gap < window - 1)),
                (DOC_WINDOW["future"], same & (gap < window)),
                (DOC_WINDOW["future"], same & (gap.abs() < window)),
                (DOC_WINDOW["forward"],
                 same & (gap <= 0) & (-gap < window)),
                (DOC_WINDOW["leak"], past & (gap < window)),
                (DOC_WINDOW["strict"], same & (gap > 0) & (gap < window)),
                (DOC_WINDOW["no_window"], same & past),
                (DOC_WINDOW["by_batch"],  # document_id[b] vs [kv_idx]
                 same[:1].expand_as(same) & past & near),
                (DOC_WINDOW["by_batch"],  # document_id[q_idx] vs [b]
                 same[:, :1].expand_as(same) & past & near),
            ])
        if problem is not None:
            return problem
    return Verdict(True, "(document_id[q_idx] == document_id[kv_idx]) & "
                         "(q_idx >= kv_idx) & (q_idx - kv_idx < window)")


SLOPES = catalogue(
    "check_alibi_slopes", 17,
    naive=("that is 2^(-8/H) for H not a power of two; the authors' "
           "code (get_slopes) takes the largest power of two not "
           "above H, then every other slope of twice as many heads",
           _ALIBI),
    ascending=("the slopes should fall from head to head: head 0 gets the "
               "largest, 2^(-8/H)", _ALIBI),
    interleaved=("the right slopes, in the wrong order: the first p heads "
                 "(p, the power of two) come first, then the extra ones; "
                 "in value they start above the steepest and then fall "
                 "between the first ones', not in head order", _ALIBI),
    sorted=("the right slopes, in the wrong order: for H not a power of "
            "two the extra heads come after the first p (in value the "
            "first is steeper than all, the rest fall between); "
            "sorting them from steep to shallow gives heads other "
            "slopes", _ALIBI),
    extra_first=("the right slopes, in the wrong order: the extra heads "
                 "come last; heads 0 to p - 1 (p, the largest power of "
                 "two not above H) take the p slopes of p heads, then "
                 "the other H - p heads take every other slope of 2p "
                 "heads", _ALIBI),
    odd_extra=("the extra heads take slopes 0, 2, 4, ... of twice as many "
               "heads ([0::2]), not 1, 3, 5, ...", _ALIBI),
    negative=("the slopes are positive; the bias is -slope * distance",
              _ALIBI),
    from_zero=("the first slope is 2^(-8/H), not 2^0 = 1: the exponent "
               "is -8 (h + 1) / H for h = 0, 1, ..., not -8 h / H", _ALIBI),
    larger=("those are the slopes of the nearest larger power of two, "
            "cut to H heads: take the largest power of two not above H, "
            "p, its p slopes, then every other slope of 2p heads for "
            "the rest", _ALIBI),
    halves=("that is 1/2, 1/4, 1/8, ... whatever H, right for 8 heads "
            "only: the slopes are 2^(-8 (h + 1) / H), so their ratio "
            "depends on H", _ALIBI),
    base_e=("those are powers of e, exp(-8 (h + 1) / H): ALiBi's slopes "
            "are powers of 2, 2 ** (-8 * (h + 1) / H), 1/2 to 1/256 for "
            "8 heads", _ALIBI),
    every_other_larger=("that is every other slope of the nearest larger "
                        "power of two, p slopes for H heads: take the "
                        "largest power of two not above H, p; the first p "
                        "heads get its p slopes, and only the other H - p "
                        "heads take every other slope of 2p heads "
                        "([0::2][:H - p])", _ALIBI),
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


def _base_e(num_heads: int) -> list[float]:
    # The recipe with every power of 2 written as a power of e.
    p = 2 ** math.floor(math.log2(num_heads))
    first = [math.exp(-8 * (h + 1) / p) for h in range(p)]
    twice = [math.exp(-8 * (h + 1) / (2 * p)) for h in range(2 * p)]
    return first + twice[0::2][:num_heads - p]


def _interleaved(num_heads: int) -> list[float]:
    # The recipe's slopes, each extra head placed after the head it
    # follows in value: the heads' order interleaved.
    p = 2 ** math.floor(math.log2(num_heads))
    first = _power_of_two(p)
    extra = _power_of_two(2 * p)[0::2][:num_heads - p]
    out = []
    for h, slope in enumerate(first):
        out += [slope] + extra[h:h + 1]
    return out


def _larger(num_heads: int) -> list[float]:
    # The slopes of the nearest larger power of two, cut to num_heads.
    return _power_of_two(2 ** math.ceil(math.log2(num_heads)))[:num_heads]


def _every_other_larger(num_heads: int) -> list[float]:
    # The slopes of the nearest larger power of two (every other one is
    # taken by the caller).
    return _power_of_two(2 ** math.ceil(math.log2(num_heads)))


def _extra_first(num_heads: int) -> list[float]:
    # The recipe's slopes with the extra heads placed before the first p.
    p = 2 ** math.floor(math.log2(num_heads))
    return _power_of_two(2 * p)[0::2][:num_heads - p] + _power_of_two(p)


def _odd_extra(num_heads: int) -> list[float]:
    p = 2 ** math.floor(math.log2(num_heads))
    return _power_of_two(p) + _power_of_two(2 * p)[1::2][:num_heads - p]


def check_alibi_slopes(fn: Callable[[int], list[float]]) -> Verdict:
    """Exercise 17.2: ``fn(num_heads)`` is the list of ALiBi's head
    slopes, also for a number of heads that is not a power of two."""
    # 12 before 6: at 6 heads the larger power's slopes, cut, are the
    # halves 1/2, 1/4, ...; at 12 the two mistakes differ
    for num_heads in (8, 12, 6, 16, 1, 4, 20):
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
                (SLOPES["interleaved"],
                 torch.tensor(_interleaved(num_heads),
                              dtype=torch.float64)),
                (SLOPES["extra_first"],
                 torch.tensor(_extra_first(num_heads),
                              dtype=torch.float64)),
                (SLOPES["odd_extra"],
                 torch.tensor(_odd_extra(num_heads), dtype=torch.float64)),
                (SLOPES["negative"], -expected),
                (SLOPES["larger"],
                 torch.tensor(_larger(num_heads), dtype=torch.float64)),
                (SLOPES["halves"], torch.tensor(
                    [2.0 ** -(h + 1) for h in range(num_heads)],
                    dtype=torch.float64)),
                (SLOPES["from_zero"],
                 torch.tensor(_from_zero(num_heads), dtype=torch.float64)),
                (SLOPES["base_e"],
                 torch.tensor(_base_e(num_heads), dtype=torch.float64)),
            ] + [(SLOPES["every_other_larger"],
                  torch.tensor(_every_other_larger(num_heads)[start::2],
                               dtype=torch.float64))
                 for start in (0, 1) if num_heads & (num_heads - 1)])
        if problem is not None:
            return problem
    return Verdict(True, "2^(-8/H), 2^(-16/H), ...; for other H, the "
                         "slopes of the nearest smaller power of two and "
                         "every other slope of twice that")


# What math.tanh, math.fabs or float() on a tensor raises inside
# flex_attention: a guard on a data-dependent value, or a conversion.
_PYTHON_MATH = ("data-dependent", "real number", "python scalar")

BIDIRECTIONAL = catalogue(
    "check_bidirectional_alibi", 17,
    sign=("the bias has the wrong sign: a far key must be penalised, "
          "score - slopes[h] * |q_idx - kv_idx|", _ALIBI),
    one_sided=("that penalises one direction only and favours the other "
               "(the decoder's signed bias, -slopes[h] * (q_idx - kv_idx), "
               "without its causal mask): use the distance on both sides, "
               "(q_idx - kv_idx).abs()", _ALIBI),
    key_only=("the key-only form slopes[h] * kv_idx gives a decoder "
              "ALiBi's weights only because its causal mask hides the "
              "later keys; without the mask it favours them, the further "
              "the more: use -slopes[h] * (q_idx - kv_idx).abs()", _ALIBI),
    unindexed=("for one score it returns one per head (slopes * distance "
               "uses the whole slopes tensor): index the slope of head "
               "h, slopes[h]", _ALIBI),
    one_slope=("every head uses the same slope: index the slopes by the "
               "head, slopes[h]", _ALIBI),
    fixed_slopes=("the bias is the same whatever slopes you are given: use "
                  "the slopes argument, slopes[h], not a tensor fixed "
                  "outside the function (such as the page's slopes4)",
                  _ALIBI),
    causal=("that is the decoder's causal ALiBi: an encoder has no causal "
            "mask, every query sees every key; drop the -inf and penalise "
            "both sides, score - slopes[h] * (q_idx - kv_idx).abs()",
            _ALIBI),
    multiplied=("that multiplies the score by a decay, score * exp("
                "-slopes[h] * |q_idx - kv_idx|), which pulls a score "
                "towards 0 instead of lowering it: ALiBi subtracts the "
                "penalty, score - slopes[h] * (q_idx - kv_idx).abs() "
                "(after the softmax, that multiplies the weight by "
                "exp(-slopes[h] * distance))", _ALIBI),
    squared=("that is a squared distance, a penalty that grows as "
             "(q_idx - kv_idx) ** 2: ALiBi's penalty is linear in the "
             "distance, score - slopes[h] * (q_idx - kv_idx).abs()",
             _ALIBI),
    no_score=("the score is gone: a score_mod returns the changed score, "
              "score - slopes[h] * |q_idx - kv_idx|, not the bias alone",
              _FLEX),
    python_math=("math.fabs (or float()) takes one Python number, but the "
                 "indices are tensors (flex_attention calls the score_mod "
                 "on all the scores at once): use (q_idx - kv_idx).abs()",
                 _FLEX),
)


def _run_score_mod(made, q: torch.Tensor, k: torch.Tensor,
                   v: torch.Tensor, python_math) -> tuple:
    """``flex_attention(q, k, v)`` with the answer's score_mod, run eagerly:
    ``(output, None)``, or ``(None, verdict)`` when it is no function or
    fails (``python_math`` names Python math met by a tensor)."""
    import warnings

    from torch.nn.attention.flex_attention import flex_attention

    if not callable(made.value):
        return None, _not_a_function(
            made, "score_mod(score, b, h, q_idx, kv_idx)")

    def flex_attention_with_your_score_mod(score_mod=made.value):
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", message=".*without torch.compile")
            return flex_attention(q, k, v, score_mod=score_mod)

    call = attempt(flex_attention_with_your_score_mod, shown="")
    if call.verdict is not None and any(
            word in str(call.error).lower() for word in _PYTHON_MATH):
        return None, python_math.verdict(f"the score_mod of {made.label}")
    if call.verdict is not None:
        return None, Verdict(False, f"the score_mod of {made.label}: "
                                    f"{call.verdict.message}")
    return call.value, None


def _dense_score_mod(score_mod: Callable,
                     scores: torch.Tensor) -> torch.Tensor | None:
    """``score_mod`` called once on all the scores ``(B, H, L, S)``, its
    indices as tensors that broadcast against them: the changed scores,
    or ``None`` for a function that only works inside flex_attention
    (Python math on a tensor, say). Cheap, unlike a trace by
    flex_attention, so it refuses most mistakes before one."""
    b = torch.arange(scores.size(0))[:, None, None, None]
    h = torch.arange(scores.size(1))[:, None, None]
    i = torch.arange(scores.size(2))[:, None]
    j = torch.arange(scores.size(3))
    try:
        changed = torch.as_tensor(score_mod(scores.clone(), b, h, i, j),
                                  dtype=scores.dtype)
        return torch.broadcast_to(changed, scores.shape)
    except Exception:  # a score_mod written for flex_attention only
        return None


def _judge_score_mod(made, q: torch.Tensor, k: torch.Tensor,
                     v: torch.Tensor, expected: torch.Tensor,
                     mistakes: list, python_math, *, flex: bool,
                     raw: Callable | None = None) -> Verdict | None:
    """``None`` when the answer's score_mod gives ``expected``, the output
    ``softmax(changed scores) @ v`` ``(B, H, L, D)``, else the verdict.
    The score_mod is called first on all the scores at once: cheap, and
    a catalogued mistake is named there, before any FlexAttention trace
    (``raw(changed)`` may name one that the softmax hides). Then it runs
    in eager flex_attention: when ``flex``, or when the dense call failed
    (a function that works only inside flex_attention)."""
    label = f"flex_attention with the score_mod of {made.label}"
    scores = q @ k.mT / math.sqrt(q.size(-1))  # (B, H, L, L)
    changed = _dense_score_mod(made.value, scores)
    if changed is not None:
        if raw is not None and (problem := raw(changed)) is not None:
            return problem
        problem = check_tensor(label, torch.softmax(changed, dim=-1) @ v,
                               expected, mistakes=mistakes)
        named = {mistake.verdict(label).message for mistake, _ in mistakes}
        if problem is not None and problem.message in named:
            return problem
        if problem is None and not flex:
            return None
    given, refused = _run_score_mod(made, q, k, v, python_math)
    if refused is not None:
        return refused
    return check_tensor(label, given, expected, axes="(B, H, L, D)",
                        mistakes=mistakes)


def _one_score_per_head(score_mod, slopes: torch.Tensor) -> bool:
    """Whether ``score_mod``, called as flex_attention calls it, on one
    score (0-d tensors), returns a score per head: ``slopes`` used
    without ``[h]``."""
    one = [torch.tensor(x) for x in (0.5, 0, 1, 3, 1)]
    try:
        changed = score_mod(*one)
    except Exception:  # a score_mod that fails here fails later too
        return False
    return (isinstance(changed, torch.Tensor) and slopes.numel() > 1
            and changed.shape == slopes.shape)


def check_bidirectional_alibi(
        fn: Callable[[torch.Tensor], Callable]) -> Verdict:
    """Exercise 17.3: ``fn(slopes)`` returns a FlexAttention ``score_mod(
    score, b, h, q_idx, kv_idx)`` for an encoder's ALiBi, ``score -
    slopes[h] * |q_idx - kv_idx|`` (no mask); checked against the dense
    computation, called on all the scores at once and (for the first
    slopes, or when it works only there) through eager
    ``flex_attention``."""
    generator = torch.Generator().manual_seed(17)
    q, k, v = torch.randn(3, 1, 4, 7, 8, generator=generator).unbind(0)
    q = 2 * q  # (B, H, L, D), scores of order 2
    scores = q @ k.mT / math.sqrt(q.size(-1))  # (B, H, L, L)
    i = torch.arange(7)[:, None]  # (L, 1) query positions
    j = torch.arange(7)  # (L,) key positions

    def out(s: torch.Tensor) -> torch.Tensor:
        return torch.softmax(s, dim=-1) @ v  # (B, H, L, D)

    distance = (i - j).abs()  # (L, L)
    for first, slopes in ((True, torch.tensor(alibi_slopes(4))),
                          (False, torch.tensor([1.0, 0.5, 0.3, 0.7]))):
        made = attempt(fn, slopes.clone(),
                       shown=f"slopes {tuple(slopes.shape)}")
        if made.verdict is not None:
            return made.verdict
        m = slopes[:, None, None]  # (H, 1, 1)
        expected = out(scores - m * distance)
        mistakes = [
            (BIDIRECTIONAL["sign"], out(scores + m * distance)),
            (BIDIRECTIONAL["one_sided"], out(scores + m * (j - i))),
            (BIDIRECTIONAL["one_sided"], out(scores - m * (j - i))),
            (BIDIRECTIONAL["one_slope"],
             out(scores - slopes[0] * distance)),
            (BIDIRECTIONAL["squared"], out(scores - m * distance ** 2)),
            (BIDIRECTIONAL["multiplied"],
             out(scores * torch.exp(-m * distance))),
            (BIDIRECTIONAL["no_score"], out(-m * distance)),
            (BIDIRECTIONAL["causal"],
             out((scores - m * distance).masked_fill(j > i, -math.inf))),
        ]
        if not first:  # the first slopes are alibi_slopes(4)
            fixed = torch.tensor(alibi_slopes(4))[:, None, None]
            mistakes.append((BIDIRECTIONAL["fixed_slopes"],
                             out(scores - fixed * distance)))

        def key_only(changed: torch.Tensor, m=m, label=made.label):
            # the softmax cannot tell m_h * j from the signed decoder
            # bias; the raw scores can
            if torch.allclose(changed, scores + m * j, atol=1e-5):
                return BIDIRECTIONAL["key_only"].verdict(
                    f"the score_mod of {label}")
            return None

        if _one_score_per_head(made.value, slopes):
            return BIDIRECTIONAL["unindexed"].verdict(
                f"the score_mod of {made.label}")
        problem = _judge_score_mod(
            made, q, k, v, expected, mistakes,
            BIDIRECTIONAL["python_math"], flex=first, raw=key_only)
        if problem is not None:
            return problem
    return Verdict(True, "score - slopes[h] * (q_idx - kv_idx).abs(): a "
                         "penalty on both sides, as flash-attn adds it")


SOFTCAP = catalogue(
    "check_softcap_score_mod", 17,
    fixed_cap=("the soft cap is the same whatever cap you are given: "
               "use the cap argument, not a fixed 50 (Gemma 2's value)",
               _FLEX),
    uncapped=("the scores come back unchanged: return cap * torch.tanh("
              "score / cap)", _FLEX),
    added=("that adds the capped score to the score, score + cap * "
           "tanh(score / cap): the soft cap replaces the score, return "
           "cap * torch.tanh(score / cap) alone", _FLEX),
    no_divide=("that is cap * tanh(score): divide by the cap inside the "
               "tanh, cap * tanh(score / cap), so that a small score "
               "passes almost unchanged", _FLEX),
    cancelled=("that is tanh(score), squeezed into (-1, 1) (so is cap * "
               "tanh(score) / cap: the cap cancels); divide inside the "
               "tanh and multiply outside: cap * torch.tanh(score / cap)",
               _FLEX),
    no_multiply=("that is tanh(score / cap), squeezed into (-1, 1): "
                 "multiply by the cap again", _FLEX),
    inverted=("that is tanh(score * cap) / cap, the cap inverted: it "
              "squeezes the scores into (-1/cap, 1/cap); divide inside "
              "the tanh, multiply outside: cap * torch.tanh(score / cap)",
              _FLEX),
    clamp=("that clips the scores at -cap and cap, a hard cap; the soft "
           "cap bends them smoothly: cap * torch.tanh(score / cap)",
           _FLEX),
    scaled_again=("the score a score_mod receives is already "
                  "q . k / sqrt(D): do not scale it again, nor undo the "
                  "scaling (by sqrt(D), D or any other factor)", _FLEX),
    math_tanh=("math.tanh takes one Python number, but score is a tensor "
               "(flex_attention calls the score_mod on all the scores at "
               "once): use torch.tanh", _FLEX),
)

def check_softcap_score_mod(fn: Callable[[float], Callable]) -> Verdict:
    """Exercise 17.4: ``fn(cap)`` returns a FlexAttention ``score_mod(
    score, b, h, q_idx, kv_idx)`` for Gemma 2's soft-capping of the
    scores, ``cap * tanh(score / cap)``; checked against the dense
    computation, called on all the scores at once and (for the first
    cap, or when it works only there) through eager
    ``flex_attention``."""
    generator = torch.Generator().manual_seed(17)
    # (B, H, L, D) with scores up to about 10, beyond the caps below
    q, k, v = torch.randn(3, 1, 2, 6, 8, generator=generator).unbind(0)
    q = 4 * q
    scores = q @ k.mT / math.sqrt(q.size(-1))  # (B, H, L, L)
    root = math.sqrt(q.size(-1))

    def out(s: torch.Tensor) -> torch.Tensor:
        return torch.softmax(s, dim=-1) @ v  # (B, H, L, D)

    for first, cap in ((True, 2.0), (False, 5.0)):
        made = attempt(fn, cap)
        if made.verdict is not None:
            return made.verdict
        expected = out(cap * torch.tanh(scores / cap))
        mistakes = [
            (SOFTCAP["added"],
             out(scores + cap * torch.tanh(scores / cap))),
            (SOFTCAP["fixed_cap"], out(50 * torch.tanh(scores / 50))),
            (SOFTCAP["uncapped"], out(scores)),
            (SOFTCAP["no_divide"], out(cap * torch.tanh(scores))),
            (SOFTCAP["no_multiply"], out(torch.tanh(scores / cap))),
            (SOFTCAP["cancelled"], out(torch.tanh(scores))),
            (SOFTCAP["inverted"], out(torch.tanh(scores * cap) / cap)),
            (SOFTCAP["clamp"], out(scores.clamp(-cap, cap))),
            (SOFTCAP["scaled_again"],
             out(cap * torch.tanh(scores / root / cap))),
            (SOFTCAP["scaled_again"],
             out(cap * torch.tanh(scores / q.size(-1) / cap))),
            (SOFTCAP["scaled_again"],
             out(cap * torch.tanh(scores * root / cap))),
            (SOFTCAP["scaled_again"],
             out(cap * torch.tanh(scores / cap) / root)),
        ]
        problem = _judge_score_mod(made, q, k, v, expected, mistakes,
                                   SOFTCAP["math_tanh"], flex=first)
        if problem is not None:
            return problem
    return Verdict(True, "cap * torch.tanh(score / cap), right for the "
                         "caps 2 and 5 tried here; Gemma 2 uses 50")


_RING = "The rolling cache"

RING = catalogue(
    "check_ring_held", 17,
    next_slot=("each position sits one slot too far on: position t goes "
               "to slot t % W, not (t + 1) % W", _RING),
    one_too_few=("position n - W is missing: the ring writes every "
                 "token, so after n tokens it holds the last W positions, "
                 "n - W to n - 1 (the next query no longer reads n - W, "
                 "but it stays until position n overwrites it)", _RING),
    one_too_many=("that is a ring of W + 1 slots: this book's W counts "
                  "the query itself, and the ring has W slots, one per "
                  "key the window keeps", _WINDOW),
    next_token=("the ring holds position n already, a token not yet "
                "written: after n tokens (positions 0 to n - 1) it holds "
                "n - W to n - 1", _RING),
    in_order=("the right positions, in position order (sorted?): slot "
              "t % W holds position t, so once the ring has wrapped round "
              "the oldest kept position is not in slot 0, and the empty "
              "slots (-W) come after the written ones", _RING),
    never_overwritten=("the ring keeps the first W positions: position t "
                       "overwrites slot t % W, which held t - W", _RING),
    unclamped=("with fewer tokens than slots, the loop from n - W writes "
               "negative positions (Python's % puts -1 in the last slot): "
               "start at max(0, n - W), so that a slot never written "
               "keeps -W", _RING),
    unclamped_in_order=("that is n - W to n - 1 in position order: with "
                        "fewer tokens than slots it starts below 0 (start "
                        "at max(0, n - W) and leave -W in a slot never "
                        "written), and slot t % W holds position t, so "
                        "the oldest kept position is not always in slot 0",
                        _RING),
    empty=("an empty slot holds -W, as held does in "
           "rolling_buffer_attention: a position at least W behind every "
           "query, which the window mask hides", _RING),
    w_minus_one_slots=("that is a ring of W - 1 slots, enough for a "
                       "ring read before it is written (the query comes "
                       "from the chunk); rolling_buffer_attention keeps "
                       "W slots, the size of Mistral's rolling buffer, "
                       "which is written before it is read: held has W "
                       "entries, position t in slot t % W", _RING),
    only_written=("held lists only the slots written so far: it has one "
                  "entry per slot, W in all, with -W in each slot not yet "
                  "written", _RING),
    empty_none=("None in a slot not yet written: held is an integer "
                "tensor, so an empty slot holds the position -W, at least "
                "W behind every query, which the window mask hides", _RING),
)


def _ring(n: int, window: int, kept: range | None = None,
          slots: int | None = None, shift: int = 0,
          empty: int | None = None) -> torch.Tensor:
    """The positions held slot by slot when the positions ``kept`` are
    written in order into ``slots`` slots, position t into slot
    (t + shift) % slots; -W (or ``empty``) where nothing was written."""
    slots = window if slots is None else slots
    kept = range(max(0, n - window), n) if kept is None else kept
    held = [-window if empty is None else empty] * slots
    for t in kept:
        held[(t + shift) % slots] = t
    return torch.tensor(held)


def check_ring_held(fn: Callable[[int, int], list[int]]) -> Verdict:
    """Exercise 17.5: ``fn(n, window)`` gives, slot by slot, the positions
    a ring of ``window`` slots holds after ``n`` tokens (positions 0 to
    n - 1), position t written into slot t % W, -W in an empty slot: the
    ``held`` of the page's ``rolling_buffer_attention``."""
    for n, window in ((2, 4), (7, 3), (9, 4), (3, 3), (10, 1), (0, 2),
                      (13, 5)):
        made = attempt(fn, n, window, shown=f"{n}, {window}")
        if made.verdict is not None:
            return made.verdict
        given = made.value
        if isinstance(given, (list, tuple)):
            if any(slot is None for slot in given):
                return RING["empty_none"].verdict(made.label)
            if (n < window and len(given) == n
                    and sorted(given) == list(range(n))):
                return RING["only_written"].verdict(made.label)
            if window > 1 and len(given) == window - 1:
                return RING["w_minus_one_slots"].verdict(made.label)
            try:
                given = torch.tensor(given)
            except (TypeError, ValueError, RuntimeError):
                return Verdict(False, f"{made.label} should give a list "
                                      f"of {window} integers, one per "
                                      f"slot, got {given!r}")
        if not isinstance(given, torch.Tensor):
            return Verdict(False, f"{made.label} should give a list of "
                                  f"{window} integers, one per slot, got "
                                  f"{type(given).__name__}")
        if given.is_floating_point():
            given = given.round().long()
        if window > 1 and given.shape == (window - 1,):
            return RING["w_minus_one_slots"].verdict(made.label)
        first = max(0, n - window)
        problem = check_tensor(
            made.label, given, _ring(n, window), axes="(W,)", mistakes=[
                (RING["next_slot"], _ring(n, window, shift=1)),
                (RING["one_too_few"], _ring(
                    n, window, range(max(0, n - window + 1), n))),
                (RING["one_too_many"], _ring(n, window, slots=window + 1,
                                             kept=range(max(0, n - window
                                                            - 1), n))),
                (RING["one_too_many"], _ring(
                    n, window, slots=window + 1, empty=-window - 1,
                    kept=range(max(0, n - window - 1), n))),
                (RING["next_token"], _ring(
                    n, window, range(max(0, n - window + 1), n + 1))),
                (RING["in_order"], torch.tensor(
                    list(range(first, n))
                    + [-window] * (window - (n - first)))),
                (RING["in_order"], _ring(n, window).sort().values),
                (RING["unclamped_in_order"], torch.arange(n - window, n)),
                (RING["never_overwritten"], _ring(
                    n, window, range(min(n, window)))),
                (RING["unclamped"], _ring(n, window,
                                          range(n - window, n))),
                (RING["empty"], _ring(n, window, empty=-1)),
                (RING["empty"], _ring(n, window, empty=0)),
            ])
        if problem is not None:
            return problem
    return Verdict(True, "slot t % W holds the latest position t < n; "
                         "the ring keeps the last W, n - W to n - 1")


_LAYERS = "Local and global layers"

REACH = catalogue(
    "check_reach_inputs", 17,
    section2=("each local layer reaches W positions back: that is the "
              "Mistral paper's section 2 count; in this book's W, which "
              "counts the query, a layer reaches W - 1 back, so k local "
              "layers reach k (W - 1)", _WINDOW),
    one_layer=("that is the reach of one layer, W - 1 back: each local "
               "layer adds W - 1 more, so k local layers reach k (W - 1) "
               "positions back", _WINDOW),
    global_as_local=("a global layer reads every earlier position, not a "
                     "window: one global layer anywhere in the stack lets "
                     "every input change the last output", _LAYERS),
    global_skipped=("this reach is the local layers' alone: a global "
                    "layer, wherever it sits in the stack, reads every "
                    "earlier position, so with one in the stack every "
                    "input can change the last output", _LAYERS),
    one_too_few=("one input too few: k local layers reach k (W - 1) "
                 "positions back, so the first input reached is "
                 "length - 1 - k (W - 1), not one later", _WINDOW),
    unclamped=("negative positions: when the reach goes past the start, "
               "the first input reached is 0 (max(0, ...))", _WINDOW),
    length_minus_kw=("a start at length - k W mixes two counts: it takes "
                     "W back per layer and drops the - 1 of the last "
                     "position, length - 1; a layer reaches W - 1 back, so "
                     "the first input is length - 1 - k (W - 1)", _WINDOW),
)


def _reach_list(length: int, back: int, clamp: bool = True) -> list[int]:
    """The positions from ``length - 1 - back`` to ``length - 1``."""
    first = length - 1 - back
    return list(range(max(0, first) if clamp else first, length))


def check_reach_inputs(
        fn: Callable[[tuple[str, ...], int, int], list[int]]) -> Verdict:
    """Exercise 17.6: ``fn(schedule, window, length)`` gives, in increasing
    order, the input positions that can change the output at the last
    position of a stack whose layers, bottom first, are ``"local"`` (a
    sliding window of ``window`` keys, the query included) or
    ``"global"`` (causal attention over every earlier position)."""
    cases = ((("local",) * 3, 3, 12), (("local", "local", "global"), 4, 16),
             (("global", "local"), 3, 8), (("local", "local"), 2, 6),
             (("local",), 5, 4), (("local",) * 4, 4096, 16384),
             (("local",) * 5, 3, 9))
    for schedule, window, length in cases:
        made = attempt(fn, schedule, window, length,
                       shown=f"{schedule}, {window}, {length}")
        if made.verdict is not None:
            return made.verdict
        given = made.value
        if isinstance(given, torch.Tensor):
            given = given.tolist()
        try:
            given = sorted(int(t) for t in given)
        except (TypeError, ValueError):
            return Verdict(False, f"{made.label} should give a list of "
                                  f"input positions, got {given!r}")
        n_local = schedule.count("local")
        layers = len(schedule)
        if "global" in schedule:
            expected = list(range(length))
        else:
            expected = _reach_list(length, layers * (window - 1))
        if given == expected:
            continue
        if "global" in schedule:
            mistakes = [
                (REACH["global_as_local"],
                 _reach_list(length, layers * (window - 1))),
                (REACH["global_skipped"],
                 _reach_list(length, n_local * (window - 1)))]
        else:
            mistakes = [
                (REACH["section2"], _reach_list(length, layers * window)),
                (REACH["one_layer"], _reach_list(length, window - 1)),
                (REACH["one_too_few"],
                 _reach_list(length, layers * (window - 1) - 1)),
                (REACH["unclamped"],
                 _reach_list(length, layers * (window - 1), clamp=False)),
                (REACH["length_minus_kw"],
                 _reach_list(length, layers * window - 1))]
        for mistake, wrong in mistakes:
            if given == wrong:
                return mistake.verdict(made.label)
        return Verdict(False, f"{made.label} should give the "
                              f"{len(expected)} positions {expected[0]} "
                              f"to {expected[-1]}, got {len(given)}")
    # worded so that its first line breaks early: 66 characters fit the
    # solution box with room to spare
    return Verdict(True, "k local layers reach k (W - 1) positions back, "
                         "clamped at position 0; one global layer lets "
                         "every input through")
