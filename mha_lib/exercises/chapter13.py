"""Checkers for chapter 13's exercises (cost and speed)."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch
from torch.utils.flop_counter import FlopCounterMode

from mha_lib.attention import masked_softmax, scaled_dot_product_attention
from mha_lib.exercises.verdict import (
    MATMUL,
    Attempt,
    Verdict,
    attempt,
    catalogue,
    check_number,
    check_tensor,
)
from mha_lib.mha import MultiHeadAttention

__all__ = ["check_score_intensity", "check_weights_mib",
           "check_tiled_softmax", "check_masked_tiles"]

# (batch, length, d_model, num_heads): the running example, GPT-2
# small's layer, a long context with many heads, a single head. No
# probe has H = 8: dropping H there divides by 8, as bits do in float32.
_CONFIGS = ((3, 6, 8, 4), (1, 1024, 768, 12), (8, 4096, 4096, 32),
            (2, 100, 64, 1))

_WORK = "Counting the work"
_BYTES = "Bytes: what has to move"
_MEMORY = "Memory: the $L \\times L$ tensors"
_FLASH = "FlashAttention: never write the $L \\times L$ matrix"
_ONLINE = "The online softmax, with causal tiles skipped"

INTENSITY = catalogue(
    "check_score_intensity", 13,
    multiply_add_once=("a multiply-add counts as 2 FLOPs, not 1", _WORK),
    one_head=("that counts the FLOPs of one head: each of the H heads "
              "does its own 2 * B * L^2 * head_dim", _WORK),
    heads_times_d_model=("each of the H heads has head_dim = d_model / H "
                         "features: 2 * B * H * L^2 * head_dim FLOPs, not "
                         "H * L^2 * d_model", _WORK),
    result_forgotten=("the product also writes S, B * H * L^2 numbers "
                      "(more than Q and K together once L > 2 * "
                      "head_dim): count its bytes too", _BYTES),
    result_one_head=("S is (B, H, L, L): each of the H heads writes its "
                     "own L x L scores, B * H * L^2 numbers, not B * L^2",
                     _BYTES),
    result_twice=("the product writes S once and never reads it: Q and K "
                  "read, S written, each once", _BYTES),
    reads_one_head=("Q and K are read for every head: (B, H, L, head_dim) "
                    "each, 2 * B * L * d_model numbers in all, not "
                    "2 * B * L * head_dim", _BYTES),
    value_counted=("Q K^T reads only Q and K; V is read later, by P V: "
                   "count Q and K read and S written", _BYTES),
    softmax_flops=("that adds the softmax's 5 * B * H * L^2 FLOPs: the "
                   "score product Q K^T alone does 2 * B * H * L^2 * "
                   "head_dim; the softmax is another step", _WORK),
    numbers_not_bytes=("that divides by numbers moved, not bytes: "
                       "multiply each count by the bytes per number "
                       "(torch.finfo(dtype).bits // 8)", _BYTES),
    bits=("that counts bits: a number of float32 is 4 bytes, of float16 "
          "and bfloat16 2 (torch.finfo(dtype).bits // 8)", _BYTES),
    float32_assumed=("a number of float16 or bfloat16 takes 2 bytes, not "
                     "4: the bytes depend on the dtype", _BYTES),
    inverted=("that is bytes per FLOP; the intensity is FLOPs per byte",
              _BYTES),
    truncated=("that is rounded down to a whole number (`int()` or "
               "`//`): the intensity is a fraction, below 1 FLOP per "
               "byte for a short sequence; divide with `/`", _BYTES),
    asymptote=("that is the limit 2 * head_dim / bytes, reached only once "
               "L >> head_dim: it leaves out the bytes of Q and K read, "
               "2 * B * L * d_model numbers; count them too", _BYTES),
)

_HALF_CASES = ((1, 1024, 512, 8, torch.bfloat16),
               (4, 4096, 1024, 16, torch.float16),
               (3, 6, 8, 4, torch.bfloat16))


def _score_intensity(batch: int, length: int, d_model: int,
                     num_heads: int, dtype: torch.dtype) -> float:
    """FLOPs of ``Q K^T`` as PyTorch's counter sees them, over the bytes of
    Q and K read once and S written once (shapes only, no data)."""
    head_dim = d_model // num_heads
    q = torch.empty(batch, num_heads, length, head_dim, dtype=dtype,
                    device="meta")  # (B, H, L, D); K has its shape
    with FlopCounterMode(display=False) as counter:
        s = q @ q.transpose(-2, -1)  # (B, H, L, L)
    moved = (2 * q.nelement() + s.nelement()) * q.element_size()
    return counter.get_total_flops() / moved


def check_score_intensity(
    fn: Callable[[int, int, int, int, torch.dtype], float],
) -> Verdict:
    """Exercise 13.1: ``fn(batch, length, d_model, num_heads, dtype)``
    returns the arithmetic intensity (FLOPs per byte) of the score product
    ``Q K^T`` of self-attention: reading Q and K once, writing S once."""
    first = None  # the first wrong number, if no catalogued mistake fits
    cases = [(*c, torch.float32) for c in _CONFIGS] + list(_HALF_CASES)
    for batch, length, d_model, num_heads, dtype in cases:
        call = attempt(fn, batch, length, d_model, num_heads, dtype)
        if call.verdict is not None:
            return call.verdict
        right = _score_intensity(batch, length, d_model, num_heads, dtype)
        size = torch.finfo(dtype).bits // 8
        reads = 2 * length * (d_model // num_heads)  # Q and K, per head
        if dtype == torch.float32:
            mistakes = [
                (INTENSITY["multiply_add_once"], right / 2),
                (INTENSITY["one_head"], right / num_heads),
                (INTENSITY["heads_times_d_model"], right * num_heads),
                (INTENSITY["result_forgotten"],
                 right * (reads + length**2) / reads),
                (INTENSITY["result_one_head"],
                 right * num_heads * (reads + length**2)
                 / (num_heads * reads + length**2)),
                (INTENSITY["result_twice"],
                 right * (reads + length**2) / (reads + 2 * length**2)),
                (INTENSITY["reads_one_head"],
                 right * (reads + length**2) / (reads / num_heads
                                                + length**2)),
                (INTENSITY["value_counted"],
                 right * (reads + length**2) / (1.5 * reads + length**2)),
                (INTENSITY["softmax_flops"],
                 right * (2 * (d_model // num_heads) + 5)
                 / (2 * (d_model // num_heads))),
                (INTENSITY["numbers_not_bytes"], right * size),
                (INTENSITY["bits"], right / 8),
                (INTENSITY["inverted"], 1 / right),
                (INTENSITY["truncated"], float(math.floor(right))),
                (INTENSITY["asymptote"],
                 right * (length + 2 * (d_model // num_heads)) / length),
            ]
        else:  # the float32 cases above caught the rest
            mistakes = [(INTENSITY["float32_assumed"], right * size / 4)]
        # A number two mistakes share at these sizes names neither.
        values = [wrong for _, wrong in mistakes]
        mistakes = [(m, w) for m, w in mistakes
                    if values.count(w) == 1 and w != right]
        problem = check_number(call.label, call.value, right, rel=1e-6,
                               mistakes=mistakes)
        if problem is not None and any(m.message in problem.message
                                       for m, _ in mistakes):
            return problem  # a catalogued mistake: its own hint
        if first is None:
            first = problem
    if first is not None:
        return first
    return Verdict(
        True, "2 L D / (bytes * (L + 2 D)) FLOPs per byte, whatever B and "
              "H: about D in bfloat16 once L >> D")


MIB = catalogue(
    "check_weights_mib", 13,
    megabytes=("a MiB is 2**20 bytes, not 10**6", _MEMORY),
    bytes=("that is bytes; divide by 2**20 for MiB", _MEMORY),
    bits=("that counts bits: an element of float32 is 4 bytes, of "
          "float16 and bfloat16 2 (torch.finfo(dtype).bits // 8)", _MEMORY),
    dtype_ignored=("an element of float16 or bfloat16 takes 2 bytes, not "
                   "4: the size depends on the dtype", _MEMORY),
    gibibytes=("that is GiB (2**30 bytes); the question is in MiB",
               _MEMORY),
    integer_division=("`// 2**20` rounds down to whole MiB (0 for a small "
                      "tensor): divide with `/`", _MEMORY),
    one_length=("that is missing a factor of L: each head's weights are "
                "(L, L), L * L numbers, one per query and key", _MEMORY),
    one_head=("that is one head's weights: each of the num_heads heads "
              "has its own (L, L) weights, (B, H, L, L) in all", _MEMORY),
    one_batch=("that is one sequence's weights: each of the batch's B "
               "sequences has its own (H, L, L) weights, (B, H, L, L) in "
               "all", _MEMORY),
    scores_too=("that is twice the weights: it counts the scores S as "
                "well as the weights P; the question asks for P alone, "
                "one (B, H, L, L) tensor", _MEMORY),
    elements=("that counts elements: multiply by the bytes per element, "
              "4 in float32, 2 in float16 and bfloat16 "
              "(torch.finfo(dtype).bits // 8)", _MEMORY),
)


def _weights_mib(batch: int, length: int, num_heads: int,
                 dtype: torch.dtype) -> float:
    weights = torch.empty(batch, num_heads, length, length, dtype=dtype,
                          device="meta")
    return weights.nelement() * weights.element_size() / 2**20


def check_weights_mib(
    fn: Callable[[int, int, int, torch.dtype], float],
) -> Verdict:
    """Exercise 13.2: ``fn(batch, length, num_heads, dtype)`` returns the
    size in MiB (2**20 bytes) of the attention weights ``(B, H, L, L)`` of
    self-attention."""
    # First a real tensor: the weights MultiHeadAttention returns for the
    # running example's input, with 2 heads (with 4, one head's weights
    # and elements without their 4 bytes would be the same number).
    with torch.random.fork_rng():  # leave the reader's random state alone
        torch.manual_seed(12)
        module = MultiHeadAttention(8, 2).eval()
        with torch.no_grad():
            _, weights = module(torch.randn(3, 6, 8))
    real = weights.nelement() * weights.element_size() / 2**20
    cases = [((3, 6, 2, torch.float32), real)]
    for batch, length, num_heads in ((1, 4096, 8), (8, 2048, 16),
                                     (2, 100, 1)):
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            cases.append(((batch, length, num_heads, dtype),
                          _weights_mib(batch, length, num_heads, dtype)))
    for args, expected in cases:
        call = attempt(fn, *args)
        if call.verdict is not None:
            return call.verdict
        size = torch.finfo(args[-1]).bits // 8
        mistakes = [
            (MIB["megabytes"], expected * 2**20 / 10**6),
            (MIB["bytes"], expected * 2**20),
            (MIB["bits"], expected * 8),
            (MIB["dtype_ignored"], expected * 4 / size),
            (MIB["gibibytes"], expected / 2**10),
            (MIB["integer_division"], round(expected * 2**20) // 2**20),
            (MIB["one_head"], expected / args[2]),
            (MIB["one_batch"], expected / args[0]),
            (MIB["one_length"], expected / args[1]),
            (MIB["elements"], expected / size),
        ]
        if size == 4:  # in 16 bits twice the weights is float32's size
            mistakes.append((MIB["scores_too"], expected * 2))
        # A number two mistakes share at these sizes names neither.
        values = [wrong for _, wrong in mistakes]
        mistakes = [(m, w) for m, w in mistakes
                    if values.count(w) == 1 and w != expected]
        problem = check_number(call.label, call.value, expected, rel=1e-9,
                               mistakes=mistakes)
        if problem is not None:
            return problem
    return Verdict(
        True, "B * H * L^2 * bytes per element: 1 x 8 heads x 4096^2 in "
              "float32 is 512 MiB, for one layer's attention weights "
              "alone")


# Operations that read a whole row of scores at once when their input is
# wider than a block: a tiled softmax never applies them to more than
# block_size scores.
_WHOLE_ROW = {
    torch.softmax, torch.Tensor.softmax, torch.nn.functional.softmax,
    torch.log_softmax, torch.Tensor.log_softmax, torch.exp,
    torch.Tensor.exp, torch.max, torch.Tensor.max, torch.amax,
    torch.Tensor.amax, torch.sum, torch.Tensor.sum, torch.logsumexp,
    torch.Tensor.logsumexp, torch.nn.functional.log_softmax,
    torch.special.softmax, torch.special.log_softmax,
    torch.special.logsumexp, torch.Tensor.exp_, torch.exp2,
    torch.special.exp2, torch.expm1, torch.Tensor.expm1,
    torch.special.expm1,
}


def _whole_row(call: Attempt, width: int, head_dim: int | None = None
               ) -> str | None:
    """The first operation of the call that read more than ``width``
    scores at once (for attention, ``head_dim`` tells the features from
    the keys in a matrix product)."""
    for func, args, _ in call.record.calls:
        first = args[0] if args else None
        if not isinstance(first, torch.Tensor) or not first.dim():
            continue
        name = getattr(func, "__name__", str(func))
        if func in _WHOLE_ROW and first.size(-1) > width:
            return f"{name} on {first.size(-1)} scores"
        if head_dim is not None and func in MATMUL and len(args) > 1 \
                and isinstance(args[1], torch.Tensor) and args[1].dim():
            inner, out = first.size(-1), args[1].size(-1)
            if inner > width and inner != head_dim:
                return f"a product over {inner} keys"
            if out > width and out != head_dim:
                return f"a product giving {out} scores"
    return None


TILED = catalogue(
    "check_tiled_softmax", 13,
    whole_row=("the scores are read in blocks of at most block_size: no "
               "softmax, max, sum or exp over a whole row", _FLASH),
    per_block=("each block is normalised on its own: divide by the sum "
               "over all blocks, rescaled when the max changes", _ONLINE),
    per_block_averaged=("a softmax per block, averaged over the blocks: "
                        "the rows sum to 1, but every block gets the same "
                        "share of the weight whatever its scores (the "
                        "tempting shortcut); divide by the sum over all "
                        "blocks, rescaled when the max changes", _ONLINE),
    no_rescale=("the running sum is not rescaled when the running max "
                "grows: multiply it by exp(m_old - m_new) first", _ONLINE),
    one_pass=("the weights of the early blocks were written with the max "
              "and sum known at that time: write them in a second pass, "
              "with the final max and sum", _ONLINE),
    no_max=("exp overflows: subtract the running max before exp",
            _ONLINE),
    fixed_reference=("exp overflows in a later block: the first block's "
                     "max (or any fixed number) is no safe reference; "
                     "subtract the running max m, updated in every block, "
                     "and rescale the sum by exp(m_old - m_new) when it "
                     "grows", _ONLINE),
    flipped_correction=("the correction is exp(m_old - m_new), at most 1: "
                        "exp(m_new - m_old) grows the old sum instead (and "
                        "is inf times 0, NaN, while m_old is still -inf)",
                        _ONLINE),
    zero_init=("the running max starts at 0, not -inf: when every score "
               "is below about -87 (in float32), exp(score - 0) underflows "
               "to 0, the sum is 0 and the weights 0 / 0 = NaN; start m at "
               "-inf", _ONLINE),
    block_max=("the second pass subtracts each block's own max: the sum "
               "was rescaled to the final running max m, so every block "
               "needs exp(block - m) with that same m", _ONLINE),
)


def _per_block_softmax(scores: torch.Tensor,
                       block_size: int) -> torch.Tensor:
    """The usual mistake: each block normalised on its own."""
    return torch.cat([torch.softmax(block, dim=-1)
                      for block in scores.split(block_size, dim=-1)],
                     dim=-1)


def _per_block_averaged(scores: torch.Tensor,
                        block_size: int) -> torch.Tensor:
    """The tempting shortcut: a softmax per block, averaged over blocks."""
    blocks = scores.split(block_size, dim=-1)
    return _per_block_softmax(scores, block_size) / len(blocks)


def _online_softmax(scores: torch.Tensor, block_size: int,
                    rescale: bool = True, second_pass: bool = True,
                    flipped: bool = False, block_max: bool = False
                    ) -> torch.Tensor:
    """The online softmax, or one of its usual wrong versions (a flipped
    correction starts from the first block's max: from -inf it is NaN)."""
    blocks = scores.split(block_size, dim=-1)
    m = blocks[0].amax(dim=-1, keepdim=True) if flipped \
        else torch.full_like(scores[..., :1], float("-inf"))
    total = torch.zeros_like(m)
    early = []
    for block in blocks:
        m_new = torch.maximum(m, block.amax(dim=-1, keepdim=True))
        scale = torch.exp(m_new - m) if flipped \
            else torch.exp(m - m_new) if rescale else 1.0
        total = scale * total + torch.exp(block - m_new).sum(
            dim=-1, keepdim=True)
        m = m_new
        early.append(torch.exp(block - m) / total)
    if not second_pass:
        return torch.cat(early, dim=-1)
    if block_max:
        return torch.cat([torch.exp(b - b.amax(dim=-1, keepdim=True))
                          / total for b in blocks], dim=-1)
    return torch.cat([torch.exp(b - m) / total for b in blocks], dim=-1)


def check_tiled_softmax(
    fn: Callable[[torch.Tensor, int], torch.Tensor],
) -> Verdict:
    """Exercise 13.3: ``fn(scores, block_size)`` returns
    ``softmax(scores, dim=-1)``, reading the last dim in blocks of
    ``block_size`` with a running max and sum (a plain ``torch.softmax``
    over the whole row is refused)."""
    generator = torch.Generator().manual_seed(1212)
    later = torch.randn(3, 8, generator=generator)
    later[:, 4:] += 100  # a later block 100 above the first: exp(100)
    # overflows float32, so a fixed reference fails here.
    cases = [  # (name, scores, block sizes, hint for inf or NaN)
        ("random (2, 3, 5, 7)",
         torch.randn(2, 3, 5, 7, generator=generator), (1, 3, 7, 10),
         "flipped_correction"),
        ("scores near 1000 (exp overflows without the max)",
         1000 + torch.randn(4, 9, generator=generator), (2, 4), "no_max"),
        ("blocks after the first 100 higher", later, (2, 4),
         "fixed_reference"),
        ("the largest score in the last block",
         torch.linspace(-5.0, 20.0, 12).expand(3, 12), (5,), "no_max"),
        ("scores near -200 (exp underflows from a max of 0)",
         -200 + torch.randn(3, 8, generator=generator), (2, 4),
         "zero_init"),
    ]
    for name, scores, block_sizes, overflow in cases:
        expected = masked_softmax(scores)
        for block_size in block_sizes:
            call = attempt(fn, scores.clone(), block_size,
                           shown=f"{name}, block_size={block_size}")
            if call.verdict is not None:
                return call.verdict
            seen = _whole_row(call, block_size)
            if seen is not None:
                return Verdict(False, f"{call.label} called {seen} at "
                                      f"once: {TILED['whole_row'].message}")
            given = call.value
            if isinstance(given, torch.Tensor) \
                    and given.shape == expected.shape \
                    and not torch.isfinite(given).all():
                return TILED[overflow].verdict(call.label)
            problem = check_tensor(
                call.label, given, expected, atol=1e-6, mistakes=[
                    (TILED["per_block"],
                     partial(_per_block_softmax, scores, block_size)),
                    (TILED["per_block_averaged"],
                     partial(_per_block_averaged, scores, block_size)),
                    (TILED["no_rescale"], partial(
                        _online_softmax, scores, block_size,
                        rescale=False)),
                    (TILED["one_pass"], partial(
                        _online_softmax, scores, block_size,
                        second_pass=False)),
                    (TILED["flipped_correction"], partial(
                        _online_softmax, scores, block_size,
                        flipped=True)),
                    (TILED["block_max"], partial(
                        _online_softmax, scores, block_size,
                        block_max=True)),
                ])
            if problem is not None:
                return problem
    return Verdict(
        True, "a running max and sum, then the weights, block by block")


MASKED_TILES = catalogue(
    "check_masked_tiles", 13,
    final_division=("NaN only for a query that may attend nothing: it "
                    "ends with o = 0 and a sum of 0, and o / sum is "
                    "0 / 0; divide only where the sum is positive and "
                    "give the other rows zeros (torch.where)", _ONLINE),
    nan=("NaN (or zeros, where a final where hid the NaN): in a tile "
         "whose keys are all masked the running max stays -inf, and "
         "exp(-inf - (-inf)) is NaN; subtract 0 where the max is still "
         "-inf", _ONLINE),
    empty_row_uniform=("the query that may attend nothing gets the average "
                       "of the values; it should get zeros, as the "
                       "library's masked softmax gives (a finite fill "
                       "cannot tell it apart)", "A row with nothing to "
                                                "attend to", 7),
    inverted=("the mask is inverted: True means \"may attend\"", _ONLINE),
    unscaled=("the scores are not scaled by 1 / sqrt(d_k)",
              "Why divide by $\\sqrt{d_k}$", 6),
    whole_row=("the keys are read in tiles of at most block_size: no "
               "softmax, max, sum, exp or product over a whole row",
               _FLASH),
    no_rescale=("the tiles' exponentials use different maxima (each "
                "tile's own, or the running max of the moment), but the "
                "sum and the output add them up unscaled: when the "
                "running max grows, multiply both by exp(m_old - m_new)",
                _ONLINE),
)


def _zero_rows(given: torch.Tensor, expected: torch.Tensor) -> bool:
    """Whether a query that sees keys got an output of zeros."""
    return bool(((given == 0).all(-1) & (expected != 0).any(-1)).any())


def _uniform_empty_rows(q, k, v, mask) -> torch.Tensor:
    out, _ = scaled_dot_product_attention(q, k, v, mask)
    empty = ~mask.any(dim=-1, keepdim=True)  # (Lq, 1)
    return torch.where(empty, v.mean(dim=-2, keepdim=True), out)


def _unscaled_tiles(q, k, v, mask, block_size: int,
                    own_max: bool) -> torch.Tensor:
    """The usual mistake: every tile's exponentials added up without the
    correction exp(m_old - m_new), with the tile's own max or the running
    one (masked tiles add nothing, a query that sees nothing gets 0)."""
    scale = q.size(-1) ** -0.5
    m = q.new_full((*q.shape[:-1], 1), float("-inf"))
    total = q.new_zeros((*q.shape[:-1], 1))
    o = q.new_zeros((*q.shape[:-1], v.size(-1)))
    for start in range(0, k.size(-2), block_size):
        keys = slice(start, start + block_size)
        s = (q @ k[..., keys, :].mT * scale).masked_fill(
            ~mask[:, keys], float("-inf"))
        top = s.amax(dim=-1, keepdim=True)
        m = top if own_max else torch.maximum(m, top)
        p = torch.exp(s - m.masked_fill(m == float("-inf"), 0.0))
        total = total + p.sum(dim=-1, keepdim=True)
        o = o + p @ v[..., keys, :]
    return torch.where(total > 0, o / total.clamp_min(1e-30), 0.0)


def check_masked_tiles(
    fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                  int], torch.Tensor],
) -> Verdict:
    """Exercise 13.4: ``fn(query, key, value, mask, block_size)`` is tiled
    attention with a bool ``mask`` ``(Lq, Lk)`` (True = may attend): the
    output of ``mha_lib.scaled_dot_product_attention``, zeros for a query
    that may attend nothing, and no NaN from a tile whose keys are all
    masked."""
    generator = torch.Generator().manual_seed(1313)
    q, k, v = torch.randn(3, 2, 3, 10, 4, generator=generator).unbind(0)
    causal = torch.ones(10, 10, dtype=torch.bool).tril()
    padded = torch.ones(10, 10, dtype=torch.bool)
    padded[:, 3:] = False  # keys 3.. are padding: whole tiles masked
    left = torch.ones(10, 10, dtype=torch.bool)
    left[:, :5] = False  # left padding: the first tiles are all masked
    empty = causal.clone()
    empty[4] = False  # query 4 may attend nothing
    cases = [("causal", causal), ("keys 3-9 padded", padded),
             ("keys 0-4 padded", left), ("query 4 fully masked", empty)]
    for name, mask in cases:
        expected, _ = scaled_dot_product_attention(q, k, v, mask)
        for block_size in (2, 3, 4):
            call = attempt(fn, q, k, v, mask, block_size,
                           shown=f"q, k, v, {name} mask, "
                                 f"block_size={block_size}")
            if call.verdict is not None:
                return call.verdict
            seen = _whole_row(call, block_size, head_dim=q.size(-1))
            if seen is not None:
                return Verdict(False, f"{call.label} called {seen} at "
                                      f"once: "
                                      f"{MASKED_TILES['whole_row'].message}")
            given = call.value
            if isinstance(given, torch.Tensor) \
                    and given.shape == expected.shape \
                    and torch.isnan(given).any():
                nan_rows = torch.isnan(given).any(dim=-1)  # (B, H, Lq)
                empty = ~mask.any(dim=-1)  # (Lq,): nothing to attend
                if empty.any() and not (nan_rows & ~empty).any():
                    return MASKED_TILES["final_division"].verdict(
                        call.label)
                return MASKED_TILES["nan"].verdict(call.label)
            problem = check_tensor(
                call.label, given, expected, axes="(B, H, Lq, Dv)",
                mistakes=[
                    (MASKED_TILES["empty_row_uniform"],
                     lambda m=mask: _uniform_empty_rows(q, k, v, m)),
                    (MASKED_TILES["inverted"],
                     lambda m=mask: scaled_dot_product_attention(
                         q, k, v, ~m)[0]),
                    (MASKED_TILES["unscaled"],
                     lambda m=mask: scaled_dot_product_attention(
                         q, k, v, m, scale=1.0)[0]),
                    (MASKED_TILES["no_rescale"],
                     lambda m=mask, b=block_size: _unscaled_tiles(
                         q, k, v, m, b, own_max=True)),
                    (MASKED_TILES["no_rescale"],
                     lambda m=mask, b=block_size: _unscaled_tiles(
                         q, k, v, m, b, own_max=False)),
                    # NaN rows a final where turned into zeros
                    (MASKED_TILES["nan"],
                     partial(_zero_rows, given, expected)),
                ])
            if problem is not None:
                return problem
    return Verdict(True, "masked tiles add nothing, and no row turns NaN")
