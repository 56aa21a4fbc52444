"""Checkers for chapter 7's exercises (padding and causal masks, a safe
softmax)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from mha_lib.attention import masked_softmax
from mha_lib.exercises.verdict import (
    Verdict,
    attempt,
    catalogue,
    check_tensor,
    source_names,
)
from mha_lib.masks import causal_mask, padding_mask

__all__ = ["check_padding_mask", "check_decoder_mask", "check_safe_softmax",
           "check_prefix_lm_mask"]

_PADDING = "Padding masks from lengths"
_CAUSAL = "Causal masks"
_EMPTY = "A row with nothing to attend to"
_HALF = "Finite fills, in float32 and in half precision"
_BEFORE_AFTER = "Before the softmax or after it?"
_FLOAT = "Float masks"

PADDING = catalogue(
    "check_padding_mask", 7,
    library=("that calls padding_mask; the exercise builds the mask "
             "without it, from a comparison", _PADDING),
    inverted=("the mask is True on the pads: in this book True means "
              "\"may attend\", so the real keys are True", _PADDING),
    one_too_many=("one key too many is visible: key j is real when "
                  "j < length, not j <= length", _PADDING),
    one_too_few=("one key too few is visible: the last real token is "
                 "hidden; key j is real when j < length, not "
                 "j < length - 1", _PADDING),
    no_lengths_axis=("arange(max_len) (Lk,) compared with lengths (B,) "
                     "does not broadcast to a table: broadcasting lines "
                     "up the last axes, Lk against B; compare with "
                     "lengths[:, None], (B, 1), to get (B, Lk)",
                     _PADDING),
    no_broadcast_axes=("the mask should be (B, 1, 1, Lk), with singleton "
                       "axes for the heads and the queries, so that it "
                       "broadcasts over (B, H, Lq, Lk)", _PADDING),
    keys_on_query_axis=("that is (B, 1, Lk, 1): the keys are on the "
                        "query axis; the keys are the last axis, "
                        "(B, 1, 1, Lk)", _PADDING),
    longest_length=("Lk is max_len, the padded length, not the longest "
                    "of the lengths", _PADDING),
    not_bool=("the mask should be bool: a 0/1 number mask would be added "
              "to the scores, not used to hide keys", _PADDING),
    additive=("that is an additive float mask (0 to keep, a large negative "
              "number to hide), added to the scores; the exercise asks for "
              "the book's bool mask, True = may attend", "Float masks"),
)


def _explain_broadcast(error: BaseException, record) -> object:
    return PADDING["no_lengths_axis"] if "must match the size" \
        in str(error) else None


def check_padding_mask(
    fn: Callable[[torch.Tensor, int], torch.Tensor],
) -> Verdict:
    """Exercise 7.1: ``fn(lengths (B,), max_len) -> (B, 1, 1, max_len)``
    bool mask, True for the first ``lengths[b]`` keys of sentence ``b``,
    built without :func:`~mha_lib.padding_mask`."""
    if fn is padding_mask or "padding_mask" in source_names(fn):
        return PADDING["library"].verdict()
    cases = [(torch.tensor([6, 6, 6, 3]), 6), (torch.tensor([2, 0, 5]), 5),
             (torch.tensor([1, 4]), 7)]
    for lengths, max_len in cases:
        call = attempt(fn, lengths.clone(), max_len,
                       explain=_explain_broadcast)
        if call.verdict is not None:
            return call.verdict
        want = padding_mask(lengths, max_len)  # (B, 1, 1, Lk)
        given = call.value
        if isinstance(given, torch.Tensor) and given.dtype != torch.bool \
                and given.shape == want.shape \
                and torch.equal(given.long(), want.long()):
            return PADDING["not_bool"].verdict(call.label)
        if isinstance(given, torch.Tensor) and given.is_floating_point() \
                and given.shape == want.shape \
                and bool((given[want] == 0).all()) \
                and bool((given[~want] < -1e3).all()):
            return PADDING["additive"].verdict(call.label)
        problem = check_tensor(
            call.label, given, want, axes="(B, 1, 1, Lk)", mistakes=[
                (PADDING["inverted"], ~want),
                (PADDING["one_too_many"], padding_mask(
                    (lengths + 1).clamp(max=max_len), max_len)),
                (PADDING["one_too_few"], padding_mask(
                    (lengths - 1).clamp(min=0), max_len)),
                (PADDING["no_broadcast_axes"], want[:, 0, 0]),
                (PADDING["no_broadcast_axes"], want[:, 0]),
                (PADDING["keys_on_query_axis"], want.transpose(-1, -2)),
                (PADDING["longest_length"],
                 partial(padding_mask, lengths, int(lengths.max()))),
            ])
        if problem is not None:
            return problem
    return Verdict(
        True,
        "the same masks as mha_lib.padding_mask, shape (B, 1, 1, Lk)")


def _calls_library_masks(fn: Callable) -> bool:
    """Whether ``fn``'s source calls the library's padding_mask or
    causal_mask, which Exercises 7.2 and 7.4 build without."""
    return bool({"padding_mask", "causal_mask"} & source_names(fn))


DECODER = catalogue(
    "check_decoder_mask", 7,
    library=("that calls padding_mask or causal_mask; the exercise "
             "builds the mask without them, from comparisons of "
             "positions", _CAUSAL),
    blocked_triangle=("the causal part is True above the diagonal, on "
                      "the keys a query may not see: that is "
                      "LLMs-from-scratch's torch.triu(..., diagonal=1), "
                      "True = blocked; in this book True = may attend, "
                      "so take its complement, torch.tril (j <= i)",
                      _CAUSAL),
    padding_only=("this is the padding mask alone: the queries still see "
                  "their future; & it with the causal mask", _CAUSAL),
    causal_only=("this is the causal mask alone: the pads are still "
                 "visible; & it with the padding mask", _PADDING),
    either=("a key is visible when it is real AND not in the future: "
            "combine the masks with &, not |", _CAUSAL),
    inverted=("the mask is True where a key is hidden; True means \"may "
              "attend\"", _PADDING),
    future=("the queries see the future and not the past: the causal "
            "part is the lower triangle, j <= i (torch.tril)", _CAUSAL),
    no_diagonal=("a query may attend itself: the causal part is j <= i, "
                 "the diagonal included", _CAUSAL),
    pad_queries=("the pad queries (rows) are hidden, so their rows see "
                 "no key at all; hide the pad keys (the last axis) only: "
                 "the pad rows then see the real tokens, and a loss "
                 "ignores them", _PADDING),
    no_head_axis=("the mask should be (B, 1, L, L), with a singleton axis "
                  "for the heads", _CAUSAL),
    transposed=("the queries and the keys are swapped: this is the right "
                "mask transposed; the keys are the last axis, for the "
                "padding (j < length) and the causal part (j <= i)",
                _CAUSAL),
)


def check_decoder_mask(
    fn: Callable[[torch.Tensor], torch.Tensor],
) -> Verdict:
    """Exercise 7.2: ``fn(lengths (B,)) -> (B, 1, L, L)`` bool mask,
    ``L = max(lengths)``: a key is visible when it is a real token and not
    in the query's future."""
    for lengths in (torch.tensor([6, 6, 6, 3]), torch.tensor([2, 5, 1])):
        length = int(lengths.max())
        pad = padding_mask(lengths, length)  # (B, 1, 1, L)
        causal = causal_mask(length)  # (L, L)
        want = pad & causal  # (B, 1, L, L)
        call = attempt(fn, lengths.clone())
        if call.verdict is not None:
            return call.verdict
        full = want.shape
        problem = check_tensor(
            call.label, call.value, want, axes="(B, 1, L, L)", mistakes=[
                (DECODER["padding_only"], pad.expand(full)),
                (DECODER["causal_only"], causal.expand(full)),
                (DECODER["either"], pad | causal),
                (DECODER["inverted"], ~want),
                (DECODER["future"], pad & causal.T),
                (DECODER["blocked_triangle"], pad & ~causal),
                (DECODER["no_diagonal"], pad & causal.tril(-1)),
                (DECODER["pad_queries"], pad.transpose(-2, -1) & causal),
                (DECODER["no_head_axis"], want[:, 0]),
                (DECODER["transposed"], want.mT),
            ])
        if problem is not None:
            return problem
    if _calls_library_masks(fn):
        return DECODER["library"].verdict()
    return Verdict(
        True,
        "padding_mask(lengths) & causal_mask(L), shape (B, 1, L, L)")


SAFE = catalogue(
    "check_safe_softmax", 7,
    finite_fill=("the query that sees no key gets uniform weights, not "
                 "zeros: a finite fill (-1e9, finfo.min) gives every key "
                 "of an empty row the same score, so the softmax spreads "
                 "the row evenly; fill with -inf and zero the empty rows",
                 _EMPTY),
    nan_to_uniform=("the query that sees no key gets uniform weights, not "
                    "zeros: nan_to_num(1/Lk) turns its NaN into 1/Lk per "
                    "key, an average of values it was told to ignore; "
                    "zero the empty rows instead", _EMPTY),
    multiplied=("the hidden scores are set to 0 (multiplied by the mask or "
                "filled with 0), not hidden: a "
                "score of 0 still gets weight e^0 after the softmax, as "
                "much as a visible key that scores 0; fill them with -inf "
                "(masked_fill) before the softmax", _BEFORE_AFTER),
    float_mask=("the mask is added to the scores as a 0/1 float "
                "(mask.float()): that adds 1 to the visible scores and 0 "
                "to the hidden ones, so it blocks nothing; keep the mask "
                "bool and fill the hidden scores with -inf (masked_fill)",
                _FLOAT),
    nan=("a query that sees no key gets NaN: a row of only -inf is "
         "0 / 0; find the empty rows and give them zeros", _EMPTY),
    half_overflow=("-1e9 does not exist in float16 (its largest number is "
                   "65504): compute in float32, or fill with -inf", _HALF),
    dtype=("return the dtype of the scores: compute in float32 if you "
           "like, then .to(scores.dtype)", "The library's masked softmax"),
    inverted=("the mask hides the keys where it is True; True means "
              "\"may attend\"", _PADDING),
    after_softmax=("a query whose hidden key scores far above its visible "
                   "ones gets no weight at all: masked after the softmax, "
                   "the visible weights underflow to 0 before the "
                   "renormalisation; fill the hidden scores with -inf "
                   "before the softmax", _BEFORE_AFTER),
    exp_overflow=("the row whose hidden key outscores the visible ones "
                  "by 120 comes back NaN: exp of that hidden score, less "
                  "the visible maximum, overflows to inf, and inf times "
                  "the mask's 0 is NaN; a mask multiplied in after exp "
                  "cannot hide it: fill the hidden scores with -inf "
                  "before exp (or the softmax)", _BEFORE_AFTER),
    no_renormalise=("the hidden weights are zeroed after the softmax, but "
                    "the rows are not renormalised: the visible weights "
                    "no longer sum to 1; fill the hidden scores with -inf "
                    "before the softmax", _BEFORE_AFTER),
    hides_nan=("a NaN in the scores (a bug upstream) comes back as "
               "finite weights: nan_to_num, or a test like w != w, turns "
               "every NaN into a number, not only the 0 / 0 of an empty "
               "row; find the empty rows from the mask and zero those "
               "alone", _EMPTY),
    in_place=("the caller's scores are changed: an in-place fill "
              "(masked_fill_) writes -inf into the tensor you were "
              "given, which the caller may still use; use masked_fill, "
              "which returns a new tensor", "d2l's `valid_lens`"),
    softmax_dim=("the softmax runs over the queries (dim=-2); it runs "
                 "over the keys, the last axis",
                 "The softmax: weights that sum to one", 6),
)


def _over_queries(scores: torch.Tensor, mask: torch.Tensor
                  ) -> torch.Tensor:
    """The masked softmax over the queries (dim=-2): the usual wrong
    axis."""
    return masked_softmax(scores.float().mT, mask.mT).mT.to(scores.dtype)


def _over_queries_filled(scores: torch.Tensor, mask: torch.Tensor,
                         fill: float | None) -> torch.Tensor:
    """The softmax over the queries with the empty rows zeroed after it;
    before it they hold 0 (``fill=None``, masked scores -inf) or the
    ``fill`` of every masked score."""
    empty = ~mask.any(dim=-1, keepdim=True)  # (B, Lq, 1)
    s = scores.float()
    if fill is None:
        s = s.masked_fill(~mask, float("-inf")).masked_fill(empty, 0.0)
    else:
        s = s.masked_fill(~mask, fill)
    weights = s.softmax(dim=-2).masked_fill(empty, 0.0)
    return weights.to(scores.dtype)


def _overflows(fn: Callable, dtype: torch.dtype) -> bool:
    """Whether ``fn`` gives a non-finite weight on a row whose hidden key
    outscores the visible maximum by a gap at which ``exp`` of that gap
    overflows ``dtype`` but the softmax's visible weights do not yet
    underflow (float32: 94, float16: 11.5): the overflow, inf * 0, of a
    hand-written exp times the mask, not the underflow of masking after
    the softmax."""
    gap = 95.0 if dtype == torch.float32 else 12.5
    s = torch.tensor([[[0.0, 1.0, gap, 0.5, -1.0]]], dtype=dtype)
    mask = torch.tensor([[[True, True, False, True, True]]])
    try:
        given = fn(s, mask)
    except Exception:  # the reader's error: the main check reports it
        return False
    return isinstance(given, torch.Tensor) \
        and not bool(given.float().isfinite().all())


def _explain_half(error: BaseException, record) -> object:
    text = str(error)
    return SAFE["half_overflow"] if "overflow" in text \
        or "Half" in text else None


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
    # One whose hidden key outscores the visible ones by 120 (e^-120
    # underflows float32): masking after the softmax loses the whole row.
    scores[1, 3] = torch.tensor([0.0, 1.0, 120.0, 0.5, -1.0])
    mask[1, 3] = torch.tensor([True, True, False, True, True])
    for dtype in (torch.float32, torch.float16):
        s = scores.to(dtype)
        given_scores = s.clone()
        call = attempt(fn, given_scores, mask.clone(),
                       shown=f"{dtype} scores {tuple(s.shape)}, mask",
                       explain=_explain_half)
        if call.verdict is not None:
            return call.verdict
        if not torch.equal(given_scores, s):  # written in place
            return SAFE["in_place"].verdict(call.label)
        given = call.value
        want = masked_softmax(s, mask)
        tol = 1e-5 if dtype == torch.float32 else 1e-3
        if isinstance(given, torch.Tensor) and given.shape == s.shape:
            unnormalised = torch.softmax(s.float(), dim=-1) * mask
            if torch.allclose(given.float(), unnormalised, atol=tol):
                return SAFE["no_renormalise"].verdict(call.label)
            multiplied = torch.softmax(s.float() * mask, dim=-1)
            empty = ~mask.any(dim=-1, keepdim=True)
            for product in (multiplied, multiplied.masked_fill(empty, 0)):
                if torch.allclose(given.float(), product, atol=tol):
                    return SAFE["multiplied"].verdict(call.label)
            added = torch.softmax(s.float() + mask.float(), dim=-1)
            for total in (added, added.masked_fill(empty, 0)):
                if torch.allclose(given.float(), total, atol=tol):
                    return SAFE["float_mask"].verdict(call.label)
            gap_row = given[1, 3].float()
            if gap_row.isnan().any() or gap_row.abs().sum() < 1e-3:
                name = ("exp_overflow" if _overflows(fn, dtype)
                        else "after_softmax")
                return SAFE[name].verdict(call.label)
            if given[0, 1].isnan().any():
                return SAFE["nan"].verdict(call.label)
            if given.dtype != dtype:
                return SAFE["dtype"].verdict(call.label)
            inverted = masked_softmax(s, ~mask).float()
            if torch.allclose(given.float(), inverted, atol=tol):
                return SAFE["inverted"].verdict(call.label)
            if not given.isnan().any() and given[0, 1].abs().sum() > 0.5:
                name = ("nan_to_uniform" if "nan_to_num" in source_names(fn)
                        else "finite_fill")
                return SAFE[name].verdict(call.label)
        problem = check_tensor(
            call.label, given, want, axes="(B, Lq, Lk)", atol=tol,
            rtol=tol, mistakes=[
                (SAFE["softmax_dim"], partial(_over_queries, s, mask)),
                (SAFE["softmax_dim"],
                 partial(_over_queries_filled, s, mask, None)),
                (SAFE["softmax_dim"], partial(
                    _over_queries_filled, s, mask,
                    torch.finfo(torch.float32).min)),
            ])
        if problem is not None:
            return problem
    # A NaN score on a visible key (a bug upstream) must stay NaN, as in
    # mha_lib.masked_softmax: an answer that hides every NaN hides it too.
    s = scores.clone()
    s[1, 2, 0] = float("nan")  # row (1, 2) sees every key
    call = attempt(fn, s, mask.clone(),
                   shown="scores with one NaN on a visible key, mask")
    if call.verdict is not None:
        return call.verdict
    given = call.value
    if isinstance(given, torch.Tensor) and given.shape == s.shape \
            and not bool(given[1, 2].isnan().any()):
        return SAFE["hides_nan"].verdict(call.label)
    return Verdict(True, "as mha_lib.masked_softmax: empty rows 0, NaN "
                         "kept, float16 too")


PREFIX = catalogue(
    "check_prefix_lm_mask", 7,
    library=("that calls padding_mask or causal_mask; the exercise "
             "builds the mask without the library's masks, from "
             "comparisons of positions", _CAUSAL),
    causal_only=("this is the decoder mask of Exercise 7.2: the prefix "
                 "is still read causally; a prefix key is visible to "
                 "every query, whatever its position", _CAUSAL),
    no_causal=("the tokens after the prefix see their future: only the "
               "prefix is read in both directions, the rest stays "
               "causal", _CAUSAL),
    prefix_on_queries=("the prefix queries (rows) see every key, the "
                       "tokens to predict included: the prefix widens "
                       "what every query sees of the keys j < p, it "
                       "never opens the keys after the prefix", _CAUSAL),
    and_for_or=("a key is visible when it is in the past OR in the "
                "prefix (and real): combine those two with |, then & "
                "the padding", _CAUSAL),
    one_too_many=("one key too many is visible: the prefix is keys "
                  "0, ..., p - 1, so j < p, not j <= p", _PADDING),
    one_too_few=("one prompt key too few is visible: the last prompt "
                 "token is read causally; the prompt is keys 0, ..., "
                 "p - 1, so j < p, not j < p - 1", _PADDING),
    no_padding=("the pads are visible: & the whole mask with the "
                "padding mask (keys j < length)", _PADDING),
    pad_queries=("the pad queries (rows) are hidden, so their rows see "
                 "no key at all; hide the pad keys (the last axis) "
                 "only", _PADDING),
    inverted=("the mask is True where a key is hidden; True means \"may "
              "attend\"", _PADDING),
    no_head_axis=("the mask should be (B, 1, L, L), with a singleton axis "
                  "for the heads", _CAUSAL),
)


def check_prefix_lm_mask(
    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> Verdict:
    """Exercise 7.4: ``fn(prefix_lens (B,), lengths (B,)) -> (B, 1, L, L)``
    bool mask, ``L = max(lengths)``: key ``j`` is visible to query ``i``
    of sentence ``b`` when it is real (``j < lengths[b]``) and in the
    past (``j <= i``) or in the prefix (``j < prefix_lens[b]``)."""
    cases = [(torch.tensor([2, 0, 3]), torch.tensor([5, 4, 3])),
             (torch.tensor([1, 3]), torch.tensor([6, 4]))]
    for prefix, lengths in cases:
        length = int(lengths.max())
        pos = torch.arange(length)
        real = (pos < lengths[:, None])[:, None, None, :]  # (B, 1, 1, L)
        past = pos[None, :] <= pos[:, None]  # (L, L): j <= i
        in_prefix = (pos < prefix[:, None])[:, None, None, :]
        want = real & (past | in_prefix)  # (B, 1, L, L)
        wide = (pos <= prefix[:, None])[:, None, None, :]
        short = (pos < prefix[:, None] - 1)[:, None, None, :]
        q_prefix = (pos < prefix[:, None])[:, None, :, None]
        call = attempt(fn, prefix.clone(), lengths.clone())
        if call.verdict is not None:
            return call.verdict
        full = want.shape
        problem = check_tensor(
            call.label, call.value, want, axes="(B, 1, L, L)", mistakes=[
                (PREFIX["causal_only"], real & past),
                (PREFIX["no_causal"], real.expand(full)),
                (PREFIX["prefix_on_queries"], real & (past | q_prefix)),
                (PREFIX["and_for_or"], real & past & in_prefix),
                (PREFIX["one_too_many"], real & (past | wide)),
                (PREFIX["one_too_few"], real & (past | short)),
                (PREFIX["no_padding"], (past | in_prefix).expand(full)),
                (PREFIX["pad_queries"],
                 real & real.mT & (past | in_prefix)),
                (PREFIX["pad_queries"],
                 real.mT & (past | in_prefix)),
                (PREFIX["inverted"], ~want),
                (PREFIX["no_head_axis"], want[:, 0]),
            ])
        if problem is not None:
            return problem
    if _calls_library_masks(fn):
        return PREFIX["library"].verdict()
    return Verdict(
        True, "real keys in the past or the prefix, (B, 1, L, L)")
