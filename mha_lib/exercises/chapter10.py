"""Checkers for chapter 10's exercises (the einsum / einops variant)."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch
from einops import rearrange

from mha_lib.exercises.verdict import (
    MATMUL,
    Verdict,
    attempt,
    catalogue,
    check_calls,
    check_tensor,
    source_names,
)
from mha_lib.masks import causal_mask, padding_mask
from mha_lib.variants import EinsumMultiHeadAttention

__all__ = [
    "check_einsum_scores",
    "check_einops_mask",
    "check_einsum_num_parameters",
    "check_split_qkv",
]

_SCORES = "`einsum`: the scores"
_SCALE = "Why divide by $\\sqrt{d_k}$"

SCORES = catalogue(
    "check_einsum_scores", 10,
    unscaled=("the scores are not scaled: divide by sqrt(D), the last "
              "dim of q", _SCALE, 6),
    scaled_by_d=("the scores are divided by D; the scale is 1 / sqrt(D)",
                 _SCALE, 6),
    scaled_by_d_model=("the scores are divided by sqrt(H * D) = "
                       "sqrt(d_model); each head's scores are scaled by "
                       "its own size, 1 / sqrt(D), D the last dim of q",
                       _SCALE, 6),
    multiplied=("the scores are multiplied by sqrt(D); divide them",
                _SCALE, 6),
    scaled_by_length=("the scores are divided by the square root of a "
                      "sequence length (Lq or Lk, the dim -2 of q or k); "
                      "the scale is 1 / sqrt(D), D = d_k the last dim of q",
                      _SCALE, 6),
    scaled_by_heads=("the scores are divided by sqrt(H), the number of "
                     "heads (dim 1); the scale is 1 / sqrt(D), D = d_k the "
                     "last dim of q", _SCALE, 6),
    softmaxed=("these are the attention weights, softmax(scores): the "
               "exercise returns the scaled scores, before the softmax",
               _SCORES),
    keys_first=("the output axes are in the wrong order: queries index "
                "the rows, 'bhld,bhtd->bhlt', not '->bhtl'", _SCORES),
    not_one_einsum=("the exercise computes the scores with a single "
                    "torch.einsum, no @ or matmul", _SCORES),
    heads_summed=("each score sums over the heads of k as well "
                  "('bhld,bgtd->bhlt'): give q and k the same head "
                  "letter, h, so that each head scores only its own keys",
                  _SCORES),
    zeros=("every score is 0: the scores are the dot products of the "
           "queries with the keys, einsum('bhld,bhtd->bhlt', q, k)",
           _SCORES),
    key_letter=("the key positions need a letter of their own (t): with "
                "the queries' letter l for both, einsum pairs query l "
                "only with key l, and Lq != Lk does not even fit; write "
                "'bhld,bhtd->bhlt'", _SCORES),
    k_transposed=("k is (B, H, Lk, D), not transposed: its subscripts "
                  "are b, h, then the key position, then the summed d, "
                  "'bhtd'; 'bhdt' reads k as (B, H, D, Lk) and pairs d "
                  "with Lk", _SCORES),
)


def _explain_key_letter(error: BaseException, record) -> object:
    if "subscript" not in str(error):
        return None
    for _, args, _ in record.find(torch.einsum):
        spec = args[0] if args and isinstance(args[0], str) else ""
        operands = spec.replace(" ", "").split("->")[0].split(",")
        if len(operands) == 2 and len(operands[0]) == len(operands[1]) == 4:
            (*_, q_pos, q_dim), (*_, k_pos, k_dim) = operands
            if k_pos == q_dim and k_dim != q_dim:  # k read as (.., D, Lk)
                return SCORES["k_transposed"]
    return SCORES["key_letter"]


def check_einsum_scores(
    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> Verdict:
    """Exercise 10.1: ``fn(q, k)`` computes the scaled scores
    ``q k^T / sqrt(D)`` with a single ``torch.einsum`` for chapter 8's
    layout, ``q (B, H, Lq, D)``, ``k (B, H, Lk, D)`` ->
    ``(B, H, Lq, Lk)``."""
    generator = torch.Generator().manual_seed(10)
    # the first case tells the scales apart: sqrt(D) = 2, D = 4,
    # sqrt(H) = 1.41, sqrt(Lq) = 1.73, sqrt(Lk) = 2.24, sqrt(H * D) = 2.83
    for batch, heads, q_len, k_len, head_dim in ((2, 2, 3, 5, 4),
                                                 (3, 4, 6, 6, 2),
                                                 (1, 2, 1, 7, 3)):
        q = torch.randn(batch, heads, q_len, head_dim, generator=generator)
        k = torch.randn(batch, heads, k_len, head_dim, generator=generator)
        call = attempt(fn, q, k, explain=_explain_key_letter)
        if call.verdict is not None:
            return call.verdict
        raw = q @ k.transpose(-2, -1)  # (B, H, Lq, Lk)
        all_heads = torch.einsum("bhld,bgtd->bhlt", q, k)  # (B, H, Lq, Lk)
        right = raw / math.sqrt(head_dim)
        problem = check_tensor(
            call.label, call.value, right, axes="(B, H, Lq, Lk)", mistakes=[
                (SCORES["unscaled"], raw),
                (SCORES["scaled_by_d"], raw / head_dim),
                (SCORES["scaled_by_d_model"],
                 raw / math.sqrt(heads * head_dim)),
                (SCORES["multiplied"], raw * math.sqrt(head_dim)),
                (SCORES["keys_first"], right.transpose(-2, -1)),
                (SCORES["scaled_by_length"], raw / math.sqrt(q_len)),
                (SCORES["scaled_by_length"], raw / math.sqrt(k_len)),
                (SCORES["scaled_by_heads"], raw / math.sqrt(heads)),
                (SCORES["softmaxed"], right.softmax(dim=-1)),
                (SCORES["heads_summed"], all_heads / math.sqrt(head_dim)),
                (SCORES["heads_summed"], all_heads),
                (SCORES["zeros"], torch.zeros_like(right)),
            ])
        if problem is not None:
            return problem
        products = call.record.find(*MATMUL)
        if len(products) != 1 or products[0][0] is not torch.einsum:
            return SCORES["not_one_einsum"].verdict(call.label)
    return Verdict(
        True, "'bhld,bhtd->bhlt': d is summed; b, h, l, t index the scores")


_INVERTED = "The mask convention is inverted"

EINOPS_MASK = catalogue(
    "check_einops_mask", 10,
    library_convention=("this is the library's mask (True = may attend); "
                        "the einops example blocks where its mask is "
                        "True: invert it", _INVERTED),
    padding_only=("only the pads are blocked: the future must be blocked "
                  "too", _INVERTED),
    causal_only=("only the future is blocked: the pads must be blocked "
                 "too", _INVERTED),
    half_inverted=("one of the two masks is inverted and the other not: "
                   "invert the combined mask, ~(padding & causal)",
                   _INVERTED),
    blocked_only_if_both=("this blocks a key only where padding and "
                          "causal masking both block it (~pad & ~causal): "
                          "a key must be blocked where either blocks it, "
                          "~pad | ~causal, which is ~(pad & causal)",
                          _INVERTED),
    diagonal_blocked=("the diagonal is blocked too (triu(0)?): a token may "
                      "attend to itself; only keys after it are the "
                      "future", _INVERTED),
    causal_transposed=("the causal mask is transposed: it blocks the "
                       "past (keys before the query) instead of the "
                       "future; causal_mask(L)[i, j] is True for j <= i, "
                       "row i a query, column j a key", _INVERTED),
    pad_queries=("the pad queries (rows) are blocked: padding blocks the "
                 "pad keys, the last axis, only; keep padding_mask's "
                 "(B, 1, L), which broadcasts over the queries",
                 _INVERTED),
    head_axis=("the class shares one (B, L, L) mask between the heads: "
               "drop the head axis of padding_mask", _INVERTED),
    not_from_library=("the exercise builds the mask from the library's "
                      "padding_mask and causal_mask", _INVERTED),
)


def _blocked_convention(verdict: Verdict) -> Verdict:
    """The generic hint states the library's convention; this exercise's
    mask is the published class's, True = blocked."""
    if "entries are wrong" not in verdict.message \
            and "should be a bool" not in verdict.message:
        return verdict  # a catalogued mistake: its hint says it all
    return Verdict(verdict.ok, verdict.message.replace(
        "True = may attend)", "True = blocked in this exercise)"))


def check_einops_mask(
    fn: Callable[[torch.Tensor, int], torch.Tensor],
) -> Verdict:
    """Exercise 10.2: ``fn(valid_lens, length)`` builds the mask
    ``(B, L, L)`` of padding and causal masking together for the einops
    example's ``MultiHeadAttentionNew``, in that class's convention:
    True = blocked, from the library's ``padding_mask`` and
    ``causal_mask``."""
    names = source_names(fn)
    for valid_lens, length in ((torch.tensor([6, 4, 3]), 6),
                               (torch.tensor([2, 5]), 5),
                               (torch.tensor([1]), 3)):
        pad = padding_mask(valid_lens, length)[:, 0]  # (B, 1, L)
        causal = causal_mask(length)  # (L, L)
        allowed = pad & causal  # (B, L, L)
        call = attempt(fn, valid_lens.clone(), length)
        if call.verdict is not None:
            return call.verdict
        full = allowed.shape
        problem = check_tensor(
            call.label, call.value, ~allowed, axes="(B, L, L)", mistakes=[
                (EINOPS_MASK["library_convention"], allowed),
                (EINOPS_MASK["padding_only"], (~pad).expand(full)),
                (EINOPS_MASK["padding_only"], ~pad),  # (B, 1, L)
                (EINOPS_MASK["causal_only"], (~causal).expand(full)),
                (EINOPS_MASK["half_inverted"], ~pad & causal),
                (EINOPS_MASK["half_inverted"], pad & ~causal),
                (EINOPS_MASK["blocked_only_if_both"], ~pad & ~causal),
                (EINOPS_MASK["diagonal_blocked"],
                 ~allowed | torch.eye(length, dtype=torch.bool)),
                (EINOPS_MASK["causal_transposed"], ~(pad & causal.T)),
                # = ~(pad & pad.mT & causal): causal already hides the pad
                # keys from the real queries
                (EINOPS_MASK["pad_queries"], ~(pad.mT & causal)),
                (EINOPS_MASK["head_axis"], ~allowed[:, None]),
                (EINOPS_MASK["head_axis"], allowed[:, None]),
            ])
        if problem is not None:
            return _blocked_convention(problem)
        # built from scratch (a helper of the reader's that calls the
        # library is fine: its source is not this function's)
        if names & {"arange", "tril", "triu", "ones"} \
                and not names & {"padding_mask", "causal_mask"}:
            return EINOPS_MASK["not_from_library"].verdict(call.label)
    return Verdict(
        True,
        "True = blocked, the opposite of mha_lib: ~(padding & causal)")


_PARTS = "Concatenate, project, add, normalise"

EINSUM_PARAMETERS = catalogue(
    "check_einsum_num_parameters", 10,
    no_layer_norm=("the LayerNorm is missing: a weight and a bias of "
                   "d_model each", _PARTS),
    no_biases=("the biases are missing: every nn.Linear(a, b) has b of "
               "them", _PARTS),
    d_model_short=("d_model parameters are missing: fc's bias or the "
                   "LayerNorm's bias (d_model each: the LayerNorm has a "
                   "weight and a bias)", _PARTS),
    no_projection_biases=("the biases of w_qs, w_ks and w_vs are missing: "
                          "n_head * d_k, n_head * d_k and n_head * d_v",
                          _PARTS),
    chapter8_sizes=("that is chapter 8's count, d_k = d_v = d_model / "
                    "n_head; here d_k and d_v are free: w_qs and w_ks have "
                    "n_head * d_k outputs, w_vs n_head * d_v",
                    "The running example and the module"),
    fc_from_d_k=("fc is counted from n_head * d_k inputs; it takes the "
                 "heads' outputs, n_head * d_v features (d_k and d_v are "
                 "free)", "The running example and the module"),
    d_k_d_v_swapped=("d_k and d_v are swapped: queries and keys have "
                     "n_head * d_k features, values n_head * d_v",
                     "The running example and the module"),
    one_head=("the factor n_head is missing: w_qs and w_ks have "
              "n_head * d_k outputs, w_vs n_head * d_v, and fc takes "
              "n_head * d_v inputs", "The running example and the module"),
    square_fc=("fc maps the n_head * d_v features of the heads back to "
               "d_model; it is not d_model x d_model", _PARTS),
    values_d_k=("the values are counted with d_k: w_vs maps d_model to "
                "n_head * d_v features, and fc maps n_head * d_v back",
                "The running example and the module"),
    queries_keys_d_v=("the queries and keys are counted with d_v: q and k "
                      "have n_head * d_k features, only the values d_v",
                      "The running example and the module"),
)


def _linear(a: int, b: int, bias: bool = True) -> int:
    return a * b + (b if bias else 0)


def _einsum_num_parameters(
    n_head: int, d_model: int, d_k: int, d_v: int
) -> int:
    # no use of the random state; sizes small enough to build
    with torch.random.fork_rng():
        module = EinsumMultiHeadAttention(n_head, d_model, d_k, d_v)
    return sum(p.numel() for p in module.parameters())


def _wrong_counts(n_head: int, d_model: int, d_k: int, d_v: int) -> list:
    def count(k: int, v: int, bias: bool = True, norm: int = 2,
              fc_in: int | None = None, in_bias: bool = True,
              heads: int = n_head) -> int:
        return (2 * _linear(d_model, heads * k, bias and in_bias)
                + _linear(d_model, heads * v, bias and in_bias)
                + _linear(fc_in or heads * v, d_model, bias)
                + norm * d_model)

    square = 4 * _linear(d_model, d_model) + 2 * d_model  # chapter 8's

    return [(EINSUM_PARAMETERS["no_layer_norm"], count(d_k, d_v, norm=0)),
            (EINSUM_PARAMETERS["d_model_short"], count(d_k, d_v, norm=1)),
            (EINSUM_PARAMETERS["no_projection_biases"],
             count(d_k, d_v, in_bias=False)),
            (EINSUM_PARAMETERS["chapter8_sizes"], square),
            (EINSUM_PARAMETERS["chapter8_sizes"], square - 2 * d_model),
            (EINSUM_PARAMETERS["fc_from_d_k"],
             count(d_k, d_v, fc_in=n_head * d_k)),
            (EINSUM_PARAMETERS["no_biases"], count(d_k, d_v, bias=False)),
            (EINSUM_PARAMETERS["d_k_d_v_swapped"], count(d_v, d_k)),
            (EINSUM_PARAMETERS["one_head"], count(d_k, d_v, heads=1)),
            (EINSUM_PARAMETERS["one_head"],
             count(d_k, d_v, heads=1, fc_in=n_head * d_v)),
            (EINSUM_PARAMETERS["square_fc"],
             count(d_k, d_v, fc_in=d_model)),
            (EINSUM_PARAMETERS["values_d_k"], count(d_k, d_k)),
            (EINSUM_PARAMETERS["values_d_k"],  # w_vs only
             count(d_k, d_k, fc_in=n_head * d_v)),
            (EINSUM_PARAMETERS["queries_keys_d_v"], count(d_v, d_v))]


def check_einsum_num_parameters(
    fn: Callable[[int, int, int, int], int],
) -> Verdict:
    """Exercise 10.3: ``fn(n_head, d_model, d_k, d_v)`` is the number of
    parameters of
    ``EinsumMultiHeadAttention(n_head, d_model, d_k, d_v)``."""
    cases = ((4, 8, 3, 5), (4, 8, 2, 2), (8, 512, 64, 64), (1, 6, 10, 1),
             (12, 96, 8, 16))
    return check_calls(
        fn, cases, _einsum_num_parameters,
        "3 input projections, fc back to d_model, LayerNorm's 2 * d_model",
        mistakes=_wrong_counts)


_REARRANGE = "`rearrange`: reshape by naming the axes"

SPLIT_QKV = catalogue(
    "check_split_qkv", 10,
    inner_heads=("'(three d h)' makes h the inner (faster) axis: head h "
                 "gets every H-th feature. Each head owns D neighbouring "
                 "features, h outer: '(three h d)'", _REARRANGE),
    per_head=("that reads the features head by head, (h three d), UvA's "
              "per-head layout; here all the queries come first, then "
              "all the keys, then all the values: '(three h d)'",
              "Another fused layout: UvA's `qkv_proj`", 5),
    role_inner=("'(h d three)' puts q, k and v side by side in every "
                "feature; the fused projection stacks them one after the "
                "other, three the outermost: '(three h d)'", _REARRANGE),
    head_first=("that is the einops example's head-first layout, "
                "(3, H, B, L, D); chapter 8's is batch first: "
                "'-> three b h l d'", "The head-first weights"),
    not_moved=("the heads are split but not moved: the output axes "
               "are '-> three b h l d', the head axis before the length "
               "axis", _REARRANGE),
    plain_reshape=("a reshape straight to (3, B, H, L, D) cuts across "
                   "tokens and roles: name the axes and let rearrange "
                   "move them", "The wrong way: `view` straight to "
                                "`(B, H, L, D)`", 5),
    no_rearrange=("right values, but the exercise asks for one "
                  "rearrange (einops) that names the axes", _REARRANGE),
)


def _split(qkv: torch.Tensor, heads: int, pattern: str,
           out: str = "three b h l d") -> torch.Tensor:
    """``qkv`` ``(B, L, 3 H D)`` read as ``pattern``, moved to ``out``."""
    return rearrange(qkv, f"b l ({pattern}) -> {out}", three=3, h=heads)


def check_split_qkv(
    fn: Callable[[torch.Tensor, int], torch.Tensor],
) -> Verdict:
    """Exercise 10.4: ``fn(qkv, num_heads)`` splits a fused projection
    ``(B, L, 3 * H * D)``, queries then keys then values, into
    ``(3, B, H, L, D)`` with one ``einops.rearrange``."""
    names = source_names(fn)
    generator = torch.Generator().manual_seed(104)
    # the first case keeps every size apart: B 2, L 5, H 3, D 4
    for batch, length, heads, head_dim in ((2, 5, 3, 4), (3, 6, 4, 2),
                                           (1, 7, 2, 3)):
        qkv = torch.randn(batch, length, 3 * heads * head_dim,
                          generator=generator)
        call = attempt(fn, qkv.clone(), heads)
        if call.verdict is not None:
            return call.verdict
        given = call.value
        if isinstance(given, (tuple, list)) and len(given) == 3 \
                and all(isinstance(t, torch.Tensor) for t in given) \
                and len({t.shape for t in given}) == 1:
            given = torch.stack(list(given))  # q, k, v as a tuple: fine
        split = partial(_split, qkv, heads)
        right = split("three h d")
        problem = check_tensor(
            call.label, given, right, axes="(3, B, H, L, D)", mistakes=[
                (SPLIT_QKV["inner_heads"], split("three d h")),
                (SPLIT_QKV["per_head"], split("h three d")),
                (SPLIT_QKV["role_inner"], split("h d three")),
                (SPLIT_QKV["role_inner"], split("d h three")),
                (SPLIT_QKV["head_first"],
                 split("three h d", "three h b l d")),
                (SPLIT_QKV["not_moved"],
                 split("three h d", "three b l h d")),
                (SPLIT_QKV["plain_reshape"],
                 qkv.reshape(3, batch, heads, length, head_dim)),
            ])
        if problem is not None:
            return problem
    if names and "rearrange" not in names:
        return SPLIT_QKV["no_rearrange"].verdict(call.label)
    return Verdict(
        True, "'b l (three h d) -> three b h l d': three and h outer, "
              "d inner; the heads moved before l")
