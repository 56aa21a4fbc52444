"""Checkers for chapter 18's exercises (multi-head latent attention)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from mha_lib.cache import KVCache
from mha_lib.exercises.verdict import (
    Recorder,
    Verdict,
    attempt,
    calls_to,
    catalogue,
    check_number,
    check_tensor,
)
from mha_lib.heads import merge_heads, split_heads
from mha_lib.latent import MultiHeadLatentAttention
from mha_lib.rotary import apply_rotary

__all__ = ["check_absorbed_query", "check_latent_cache_bytes",
           "check_key_projection", "check_absorbed_scores",
           "check_decode_flops_per_byte", "check_absorbed_step"]

_ABSORBED = "The absorbed form"
_LATENT = "Keys and values from a latent"
_TABLE = "One table: what each design caches"
_ROPE = "Positions need their own key"
_BOUND = "What bounds a decoding step"
_DECODE = "Decoding with a latent cache"

ABSORB = catalogue(
    "check_absorbed_query", 18,
    not_per_head=("w_uk holds one (D, C) block per head, stacked by rows: "
                  "unflatten its first axis into (H, D) and multiply each "
                  "head's queries by its own block", _ABSORBED),
    head_minor=("the rows of w_uk are grouped head by head, "
                "unflatten(0, (H, D)), not (D, H)", _LATENT),
    transposed=("the latent query is W_uk[h]^T q_h: with q as rows that "
                "is q @ W_uk[h], each head's (D, C) block as stored "
                "(w_uk.unflatten(0, (H, D))[h]), not transposed nor "
                "reshaped to (C, D)",
                _ABSORBED),
    heads_merged=("that adds up the heads: merged heads (B, L, H * D) @ "
                  "w_uk sum every head's latent query into one; keep the "
                  "head axis, (B, H, L, D) @ (H, D, C) -> (B, H, L, C)",
                  _ABSORBED),
    scaled=("no scale here: the latent query only moves W_uk[h] to the "
            "query side; the scores are scaled later, by 1/sqrt(D + R), "
            "as in the explicit form", _ABSORBED),
    head_zero=("every head used head 0's block, w_uk[:D]: head h has its "
               "own W_uk[h], rows h*D to (h+1)*D - 1 of w_uk; "
               "w_uk.unflatten(0, (H, D)) stacks them for one batched "
               "product", _ABSORBED),
    unchanged=("that is q unchanged: head h's queries are multiplied by "
               "its block W_uk[h], rows h*D to (h+1)*D - 1 of w_uk, "
               "which takes them from D to C features", _ABSORBED),
    whole_transposed=("q @ w_uk.T multiplies by the whole (C, H * D) "
                      "transpose: every head's D features meet the first "
                      "D columns; head h needs only its own (D, C) "
                      "block, w_uk.unflatten(0, (H, D)), not transposed",
                      _ABSORBED),
)


def _explain_absorb(error: BaseException, record) -> object:
    return ABSORB["not_per_head"] if "shape" in str(error) \
        or "size" in str(error) else None


def check_absorbed_query(
    fn: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor],
) -> Verdict:
    """Exercise 18.1: ``fn(q, w_uk, num_heads)`` maps queries
    ``(B, H, L, D)`` to the latent space, ``(B, H, L, C)``, so that
    ``fn(q, w_uk, H) @ c.T`` equals ``q @ k.T`` for the keys
    ``k = split_heads(c @ w_uk.T)`` rebuilt from latents ``c`` ``(L, C)``;
    ``w_uk`` is ``k_up.weight``, ``(H * D, C)``."""
    generator = torch.Generator().manual_seed(18)
    # D = C first: there a transposed block still fits the shapes
    for batch, heads, length, head_dim, latent in ((2, 3, 2, 3, 3),
                                                   (2, 4, 5, 3, 6),
                                                   (1, 2, 3, 4, 2),
                                                   (1, 1, 4, 2, 5)):
        q = torch.randn(batch, heads, length, head_dim, generator=generator)
        w_uk = torch.randn(heads * head_dim, latent, generator=generator)
        c = torch.randn(length, latent, generator=generator)
        call = attempt(fn, q, w_uk, heads, explain=_explain_absorb)
        if call.verdict is not None:
            return call.verdict
        blocks = w_uk.unflatten(0, (heads, head_dim))  # (H, D, C)
        expected = q @ blocks  # (B, H, L, C)
        problem = check_tensor(
            call.label, call.value, expected, axes="(B, H, L, C)",
            atol=1e-4, rtol=1e-4, mistakes=[
                (ABSORB["head_minor"], partial(
                    torch.matmul, q, w_uk.unflatten(
                        0, (head_dim, heads)).transpose(0, 1))),
                (ABSORB["transposed"], partial(torch.matmul, q, blocks.mT)),
                (ABSORB["transposed"], partial(
                    torch.matmul, q,
                    w_uk.reshape(heads, latent, head_dim).mT)),
                (ABSORB["heads_merged"], partial(
                    torch.matmul, q.transpose(1, 2).flatten(2), w_uk)),
                (ABSORB["heads_merged"], (  # the sum broadcast to heads
                    q.transpose(1, 2).flatten(2) @ w_uk)[:, None].expand(
                        -1, heads, -1, -1)),
                (ABSORB["scaled"], partial(torch.div, expected,
                                           head_dim ** 0.5)),
                (ABSORB["head_zero"], partial(torch.matmul, q, blocks[0])),
                (ABSORB["unchanged"], q),
                (ABSORB["whole_transposed"],
                 partial(torch.matmul, q, w_uk.T)),
            ])
        if problem is not None:
            return problem
        # what the exercise promises: the scores against the latents
        keys = (c @ w_uk.T).unflatten(-1, (heads, head_dim)).transpose(
            0, 1)  # (H, L, D)
        problem = check_tensor(f"{call.label} @ c.T", call.value @ c.T,
                               q @ keys.transpose(-2, -1), atol=1e-4,
                               rtol=1e-4)
        if problem is not None:
            return problem
    return Verdict(True, "q_h . (W_uk[h] c) = (W_uk[h]^T q_h) . c: the "
                         "key up-projection moves to the query side")


CACHE = catalogue(
    "check_latent_cache_bytes", 18,
    per_head=("that is a multi-head cache of keys and values; this one "
              "holds the latent and the rotary key", _TABLE),
    factor_two=("no factor 2: one latent serves both keys and values",
                _DECODE),
    times_heads=("no factor H: the latent and the rotary key are shared "
                 "by all heads, C + R numbers per token whatever the "
                 "number of heads", _DECODE),
    no_rope=("the rotary key is cached too, beside the latent: C + R "
             "numbers per token", "Positions need their own key"),
    rope_twice=("one rotary key of R numbers per token, shared by all "
                "heads; the values have no rotary part, and the queries "
                "are not cached: C + R", "Positions need their own key"),
    half_rope=("the rotary key is cached whole, R numbers per token: "
               "rope_dim is its width, not the number of rotation pairs "
               "(R / 2 pairs of 2 numbers each): C + R",
               "Positions need their own key"),
    bits=("that counts bits: bytes_per_number is already in bytes",
          _TABLE),
    no_bytes=("that counts numbers, not bytes: multiply by "
              "bytes_per_number", _TABLE),
    no_batch=("that is one sequence; the batch multiplies it", _TABLE),
    no_length=("that is one token's cache: multiply by length, the "
               "number of tokens cached", _TABLE),
    all_layers=("that is DeepSeek-V2's 60 layers: the function gives one "
                "layer's cache; multiply by the layers only in the "
                "question after it", _TABLE),
    gib=("that is in GiB (or GB): the function returns bytes; divide by "
         "2**30 only where you print the answer", _TABLE),
)


def check_latent_cache_bytes(fn: Callable[..., int]) -> Verdict:
    """Exercise 18.2: ``fn(kv_latent_dim, rope_dim, length, batch,
    bytes_per_number)`` is the memory, in bytes, of one layer's cache of
    :class:`~mha_lib.MultiHeadLatentAttention` after ``length`` tokens
    (measured: a module fills a real :class:`~mha_lib.KVCache`)."""
    # First the case where 2 x d_model numbers per token (a multi-head
    # cache) is no whole multiple of C + R: a stray factor is not called
    # a multi-head cache.
    for latent, rope, length, batch, dtype, heads in (
            (8, 2, 7, 3, torch.bfloat16, 4),
            (6, 2, 5, 2, torch.float32, 4), (4, 4, 3, 1, torch.float64, 2)):
        with torch.random.fork_rng():  # leave the reader's state alone
            module = MultiHeadLatentAttention(16, heads, latent,
                                              rope).to(dtype)
        cache = KVCache()
        with torch.no_grad():
            module(torch.zeros(batch, length, 16, dtype=dtype),
                   is_causal=True, cache=cache)
        size = torch.empty((), dtype=dtype).element_size()
        call = attempt(fn, latent, rope, length, batch, size)
        if call.verdict is not None:
            return call.verdict
        full = cache.nbytes
        tokens = length * batch * size
        problem = check_number(call.label, call.value, full, mistakes=[
            (CACHE["per_head"], 2 * 16 * tokens),
            (CACHE["factor_two"], 2 * full),
            (CACHE["factor_two"], (2 * latent + rope) * tokens),
            (CACHE["times_heads"], heads * full),
            (CACHE["no_rope"], latent * tokens),
            (CACHE["rope_twice"], (latent + 2 * rope) * tokens),
            (CACHE["half_rope"], (latent + rope // 2) * tokens),
            (CACHE["bits"], 8 * full),
            (CACHE["no_bytes"], full // size),
            (CACHE["no_batch"], full // batch),
            (CACHE["no_length"], full // length),
            (CACHE["all_layers"], 60 * full),
            (CACHE["gib"], full / 2**30),
            (CACHE["gib"], full / 1e9),
        ])
        if problem is not None:
            return problem
    return Verdict(True, "(C + R) x L x B x bytes per number, whatever the "
                         "number of heads")


KEY = catalogue(
    "check_key_projection", 18,
    transposed=("W is transposed: nn.Linear computes x @ weight.T, so W "
                "is (H * D, d_model), k_up.weight @ kv_down.weight",
                _LATENT),
    wrong_order=("kv_down comes first, then k_up: the product is "
                 "k_up.weight @ kv_down.weight, the later layer on the "
                 "left", _LATENT),
    values=("that is the value projection (v_up); the keys go through "
            "k_up", _LATENT),
    latent_only=("that is kv_down.weight alone, the map from x to the "
                 "latent: you left out k_up, which turns the latent into "
                 "keys; W = k_up.weight @ kv_down.weight", _LATENT),
    up_only=("that is k_up.weight alone, which reads the latent, not x: "
             "you left out kv_down; W = k_up.weight @ kv_down.weight",
             _LATENT),
    both_transposed=("both weights are transposed and in the wrong order: "
                     "k_up.weight.T @ kv_down.weight.T is (C, C); W is "
                     "k_up.weight @ kv_down.weight, (H * D, d_model)",
                     _LATENT),
)


def _explain_key(error: BaseException, record) -> object:
    return KEY["wrong_order"] if "shape" in str(error) \
        or "size" in str(error) else None


def check_key_projection(
    fn: Callable[[MultiHeadLatentAttention], torch.Tensor],
) -> Verdict:
    """Exercise 18.3: ``fn(module)`` is the one matrix ``W`` ``(H * D,
    d_model)`` with ``k_up(kv_down(x)) = x @ W.T`` (``bias=False``): the
    key projection that the latent factors into two."""
    generator = torch.Generator().manual_seed(19)
    for d_model, heads, latent in ((16, 4, 6), (12, 3, 2), (8, 2, 8)):
        with torch.random.fork_rng():  # leave the reader's state alone
            torch.manual_seed(19 + d_model)
            module = MultiHeadLatentAttention(d_model, heads, latent, 2)
        x = torch.randn(2, 5, d_model, generator=generator)
        call = attempt(fn, module,
                       shown=f"MultiHeadLatentAttention({d_model}, "
                             f"{heads}, {latent}, 2)",
                       explain=_explain_key)
        if call.verdict is not None:
            return call.verdict
        up, down = module.k_up.weight, module.kv_down.weight
        with torch.no_grad():
            expected = up @ down  # (H * D, d_model)
            problem = check_tensor(
                call.label, call.value, expected, axes="(H * D, d_model)",
                mistakes=[
                    (KEY["transposed"], expected.T),
                    (KEY["wrong_order"], partial(torch.matmul, down, up)),
                    (KEY["values"], module.v_up.weight @ down),
                    (KEY["latent_only"], down),
                    (KEY["up_only"], up),
                    (KEY["both_transposed"],
                     partial(torch.matmul, up.T, down.T)),
                ])
            if problem is not None:
                return problem
            given = x @ call.value.detach().T
            problem = check_tensor(
                f"x @ {call.label}.T", given,
                module.k_up(module.kv_down(x)))
        if problem is not None:
            return problem
    return Verdict(True, "W = k_up.weight @ kv_down.weight, of rank at "
                         "most kv_latent_dim")


SCORES = catalogue(
    "check_absorbed_scores", 18,
    latent_rotated=("the latent part carries no positions: rotate only the "
                    "rotary query and the shared rotary key, never the "
                    "latent query nor the latents (rotating them is what "
                    "breaks the absorbed form)", _ROPE),
    not_rotated=("the rotary part must be rotated: apply_rotary to the "
                 "rotary queries and to the shared rotary key at "
                 "positions 0 to L - 1; without it the scores carry no "
                 "positions", _ROPE),
    no_rope=("the rotary part is missing: add the rotated queries' "
             "scores against the shared rotary key, q_r @ k_r[:, None].mT "
             "(its head axis second), to the latent scores", _ROPE),
    scale_d=("the scale is over the full head width D + R (content and "
             "rotary parts together), not D alone", _ROPE),
    scale_c=("the scale is over the full head width D + R, not the "
             "latent's width C: the latent is what is cached, not a "
             "head's query or key", _ROPE),
    scale_latent=("the absorbed form changes the order of the products, "
                  "not the scores: the scale stays 1/sqrt(D + R), not "
                  "1/sqrt(C + R)", _ABSORBED),
    d_model_heads=("the head width is m.head_dim, not d_model / H: the "
                   "module may set head_dim apart; the scale is "
                   "1/sqrt(m.head_dim + m.rope_dim)", _ROPE),
    unscaled=("the scores are scaled by 1/sqrt(D + R), the full head "
              "width, as in the explicit form", _ROPE),
    transposed=("head h's latent query is q_h @ W_uk[h], its (D, C) "
                "block of k_up.weight as stored (rows h*D to (h+1)*D - "
                "1), not transposed nor reshaped to (C, D)", _ABSORBED),
    key_not_rotated=("the shared rotary key must be rotated too: "
                     "apply_rotary(k_r, positions), as the rotary "
                     "queries; a rotated query against an unrotated key "
                     "gives a score that depends on the query's "
                     "position, not on the offset", _ROPE),
    query_not_rotated=("the rotary queries must be rotated too: "
                       "apply_rotary(q_r, positions), as the shared "
                       "rotary key; an unrotated query against a "
                       "rotated key gives a score that depends on the "
                       "key's position, not on the offset", _ROPE),
    softmax=("that is the softmax of the scores: return the scores "
             "themselves, before the mask and the softmax", _ROPE),
    masked=("those scores are masked: return them before the mask (the "
            "-inf above the diagonal comes later, with the softmax)",
            _ROPE),
    positions_mismatch=("the rotary queries and the shared rotary key "
                        "rotate at the same positions: token i's query "
                        "and key both at i, 0 to L - 1 in order; at "
                        "other positions the score no longer depends on "
                        "the offset i - j alone", _ROPE),
    split_scale=("one scale for the whole score, 1/sqrt(D + R): the "
                 "content and rotary parts are two halves of one dot "
                 "product of D + R numbers, not scaled by 1/sqrt(D) and "
                 "1/sqrt(R) apart", _ROPE),
    head_zero=("every head used head 0's block, k_up.weight[:D]: head "
               "h has its own W_uk[h], rows h*D to (h+1)*D - 1 of "
               "k_up.weight; unflatten(0, (H, D)) stacks them for one "
               "batched product (exercise 18.1)", _ABSORBED),
    head_axis=("the shared rotary key k_r (B, L, R) or the latents c "
               "(B, L, C) lost their head axis: in q_r @ k_r.mT (or "
               "with k_r[None], the axis in front) broadcasting lines "
               "their batch axis up with the queries' head axis, so "
               "head h scores sequence h's keys; it runs only because "
               "B = H here. Put the head axis second: k_r[:, None] "
               "(B, 1, L, R), c[:, None] (B, 1, L, C)",
               "Padding masks from token ids", 7),
    heads_swapped=("those scores are (H, B, L, L), the batch and head "
                   "axes swapped (the shape fits only where B = H, as "
                   "here): return them (B, H, L, L), batch first",
                   _ROPE),
    rebuilt_keys=("that rebuilds every head's keys from the latents "
                  "(m.k_up on them, or by hand with m.k_up.weight): "
                  "the explicit form. The absorbed form rebuilds none: "
                  "move W_uk to the query side (exercise 18.1's "
                  "absorb_query, with m.k_up.weight) and score the "
                  "latent queries against the latents", _ABSORBED),
    one_einsum=("one torch.einsum over three tensors (the query, W_uk "
                "and the latents) leaves the order of the products to "
                "einsum, which may rebuild the keys: write the "
                "absorption yourself, the latent query q @ W_uk first "
                "(exercise 18.1), then its scores against the latents",
                _ABSORBED),
)


def _on_tokens(tokens: torch.Size, args: tuple) -> bool:
    """Whether a call of ``k_up`` is on every token's latent ``(B, L, C)``
    (the keys rebuilt); a call on other rows, such as the basis vectors
    that read its matrix, is no rebuild."""
    return bool(args) and isinstance(args[0], torch.Tensor) \
        and args[0].shape[:-1] == tokens


def _einsum_operands(args: tuple) -> int:
    """How many tensors a ``torch.einsum`` call contracts, given one by
    one or as a list."""
    operands = args[1:]
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = operands[0]
    return sum(isinstance(a, torch.Tensor) for a in operands)


def _rebuilt_by_hand(record: Recorder, keys: torch.Tensor) -> bool:
    """Whether the reader's code handed a torch function the rebuilt
    content keys ``keys`` ``(B, H, L, D)``, in any of their layouts:
    ``(B, L, H * D)``, ``(B, L, H, D)``, ``(B, H, L, D)``, one head's
    ``(B, L, D)``, one sequence's, or one sequence's one head: keys
    rebuilt by hand, ``c @ m.k_up.weight.T``, where no ``m.k_up`` call
    shows them. The right answer never holds them: its latent queries
    are ``C`` wide and its scores ``L``."""
    batch, heads, length, width = keys.shape
    merged = keys.transpose(1, 2)  # (B, L, H, D)
    layouts = [keys, merged, merged.flatten(2)]
    layouts += [keys[:, h] for h in range(heads)]  # (B, L, D)
    layouts += [one for b in range(batch) for one in (
        keys[b], merged[b], merged[b].flatten(1),
        *(keys[b, h] for h in range(heads)))]
    shapes = {tuple(k.shape) for k in layouts}
    for _, args, kwargs in record.calls:
        given = [*args, *kwargs.values()]
        given += [t for a in given if isinstance(a, (list, tuple))
                  for t in a]
        for a in given:
            if not isinstance(a, torch.Tensor) or not \
                    a.is_floating_point() or tuple(a.shape) not in shapes:
                continue
            a = a.detach().to(keys.dtype)
            if any(a.shape == k.shape and torch.allclose(
                    a, k, atol=1e-5, rtol=1e-4) for k in layouts):
                return True
    return False


def _scores(m: MultiHeadLatentAttention, x: torch.Tensor, *,
            rotate_latent: str = "", rotate: bool = True,
            rope: bool = True, width: int | None = None,
            transposed: bool = False, rotate_key: bool = True,
            rotate_query: bool = True, query_flipped: bool = False,
            split_scale: bool = False,
            head_zero: bool = False,
            no_head_axis: str = "") -> torch.Tensor:
    """The pre-softmax scores ``(B, H, L, L)`` of ``m`` on ``x``, in the
    absorbed form, or with one planted mistake. ``rotate_latent`` rotates
    what carries no positions: "both" the latent queries and the latents,
    "latents" or "query" one of them, "content" the content queries
    before the absorption and the latents, "whole" the joined
    ``[latent query; rotary query]`` and ``[latent; rotary key]``.
    ``no_head_axis`` leaves the head axis off "rope" (the shared rotary
    key), "latent" (the latents) or "both": it runs only where B = H."""
    heads, head_dim = m.num_heads, m.head_dim
    pos = torch.arange(x.size(1))
    q = split_heads(m.q_proj(x), heads)  # (B, H, L, D)
    q_r = split_heads(m.q_rope_proj(x), heads)  # (B, H, L, R)
    k_r = m.k_rope_proj(x)  # (B, L, R)
    if rotate:
        q_pos = pos.flip(0) if query_flipped else pos
        q_r = apply_rotary(q_r, q_pos) if rotate_query else q_r
        k_r = apply_rotary(k_r, pos) if rotate_key else k_r
    c = m.kv_down(x)  # (B, L, C)
    w = m.k_up.weight.unflatten(0, (heads, head_dim))  # (H, D, C)
    if transposed:
        w = w.mT
    if head_zero:  # head 0's block for every head
        w = w[:1].expand(heads, -1, -1)
    if rotate_latent == "content":
        q, c = apply_rotary(q, pos), apply_rotary(c, pos)
    latent_q = q @ w  # (B, H, L, C)
    if rotate_latent in ("both", "query"):
        latent_q = apply_rotary(latent_q, pos)
    if rotate_latent in ("both", "latents"):
        c = apply_rotary(c, pos)
    if rotate_latent == "whole":  # one rotation over C + R features
        q_r = split_heads(m.q_rope_proj(x), heads)
        joined_q = apply_rotary(torch.cat([latent_q, q_r], -1), pos)
        joined_k = apply_rotary(torch.cat([c, m.k_rope_proj(x)], -1),
                                pos)  # (B, L, C + R)
        return (joined_q @ joined_k[:, None].mT
                / (head_dim + m.rope_dim) ** 0.5)
    if no_head_axis not in ("rope", "both"):
        k_r = k_r[:, None]  # (B, 1, L, R)
    if no_head_axis not in ("latent", "both"):
        c = c[:, None]  # (B, 1, L, C)
    s = latent_q @ c.mT  # (B, H, L, L)
    if split_scale:
        return (s / head_dim ** 0.5
                + q_r @ k_r.mT / m.rope_dim ** 0.5)
    if rope:
        s = s + q_r @ k_r.mT
    return s / (head_dim + m.rope_dim if width is None else width) ** 0.5


def check_absorbed_scores(
    fn: Callable[[MultiHeadLatentAttention, torch.Tensor], torch.Tensor],
) -> Verdict:
    """Exercise 18.4: ``fn(m, x)`` is head ``h``'s scores before the mask
    and softmax, ``(B, H, L, L)``, computed in the absorbed form: the
    latent query ``q_h @ W_uk[h]`` against the latents plus the rotated
    rotary query against the shared rotated rotary key, over
    ``sqrt(D + R)``; checked against the scores over rebuilt keys.
    Rebuilt keys are refused: a call of ``m.k_up`` on the latents, or
    the keys themselves (``c @ m.k_up.weight.T``) in the reader's
    code."""
    generator = torch.Generator().manual_seed(20)
    # D = C first: there a transposed block still fits the shapes. There
    # a scale over sqrt(D) is one over sqrt(C): the next modules, with
    # D != C, name which (``deferred``).
    deferred = None
    for d_model, heads, latent, rope, head_dim in ((8, 2, 4, 2, 4),
                                                   (12, 3, 6, 4, 2),
                                                   (16, 4, 4, 2, 6)):
        with torch.random.fork_rng():  # leave the reader's state alone
            torch.manual_seed(20 + d_model)
            m = MultiHeadLatentAttention(d_model, heads, latent, rope,
                                         head_dim=head_dim)
        x = torch.randn(2, 5, d_model, generator=generator)
        shown = (f"MultiHeadLatentAttention({d_model}, {heads}, {latent}, "
                 f"{rope}, head_dim={head_dim}), x {tuple(x.shape)}")
        on_latents = partial(_on_tokens, x.shape[:-1])  # keys rebuilt
        with calls_to(m.k_up, on_latents) as called, torch.no_grad():
            call = attempt(fn, m, x, shown=shown)
        if call.verdict is not None:
            return call.verdict
        if called:
            return SCORES["rebuilt_keys"].verdict(call.label)
        with torch.no_grad():
            rebuilt = split_heads(m.k_up(m.kv_down(x)), heads)
            if _rebuilt_by_hand(call.record, rebuilt):
                return SCORES["rebuilt_keys"].verdict(call.label)
            if any(_einsum_operands(args) >= 3
                   for _, args, _ in call.record.find(torch.einsum)):
                return SCORES["one_einsum"].verdict(call.label)
            # the naive form: every head's key rebuilt, then rotated part
            pos = torch.arange(x.size(1))
            q = torch.cat([split_heads(m.q_proj(x), heads), apply_rotary(
                split_heads(m.q_rope_proj(x), heads), pos)], -1)
            k_c = split_heads(m.k_up(m.kv_down(x)), heads)  # (B, H, L, D)
            k_r = apply_rotary(m.k_rope_proj(x), pos)[:, None]
            k = torch.cat([k_c, k_r.expand(-1, heads, -1, -1)], -1)
            expected = q @ k.mT / (head_dim + rope) ** 0.5
            mistakes = [
                *((SCORES["latent_rotated"],
                   partial(_scores, m, x, rotate_latent=where))
                  for where in ("both", "latents", "query", "content",
                                "whole")),
                (SCORES["not_rotated"], partial(_scores, m, x,
                                                rotate=False)),
                (SCORES["no_rope"], partial(_scores, m, x, rope=False)),
                (SCORES["scale_d"], partial(_scores, m, x,
                                            width=head_dim)),
                (SCORES["scale_c"], partial(_scores, m, x, width=latent)),
                (SCORES["scale_latent"], partial(_scores, m, x,
                                                 width=latent + rope)),
                (SCORES["unscaled"], partial(_scores, m, x, width=1)),
                *((SCORES["d_model_heads"], partial(
                    _scores, m, x, width=d_model // heads + extra))
                  for extra in (0, rope)
                  if d_model // heads != head_dim),
                (SCORES["key_not_rotated"], partial(_scores, m, x,
                                                    rotate_key=False)),
                (SCORES["query_not_rotated"], partial(
                    _scores, m, x, rotate_query=False)),
                (SCORES["split_scale"], partial(_scores, m, x,
                                                split_scale=True)),
                (SCORES["positions_mismatch"], partial(
                    _scores, m, x, query_flipped=True)),
                (SCORES["head_zero"], partial(_scores, m, x,
                                              head_zero=True)),
            ]
            causal = torch.ones(x.size(1), x.size(1),
                                dtype=torch.bool).tril()
            masked = expected.masked_fill(~causal, float("-inf"))
            mistakes += [
                (SCORES["masked"], masked),
                (SCORES["softmax"], masked.softmax(-1)),
                (SCORES["softmax"], expected.softmax(-1)),
            ]
            if head_dim == latent:
                mistakes.append((SCORES["transposed"], partial(
                    _scores, m, x, transposed=True)))
            if x.size(0) == heads:  # B = H: the slips below run
                mistakes += [(SCORES["head_axis"], partial(
                    _scores, m, x, no_head_axis=where))
                    for where in ("rope", "latent", "both")]
                mistakes.append((SCORES["heads_swapped"],
                                 expected.transpose(0, 1)))
            problem = check_tensor(call.label, call.value, expected,
                                   axes="(B, H, L, L)", atol=1e-5,
                                   rtol=1e-4, mistakes=mistakes)
        if problem is not None and head_dim == latent and (
                SCORES["scale_d"].message in problem.message):
            deferred = problem  # sqrt(D) or sqrt(C)? the next module says
            continue
        if problem is not None:
            return problem
    if deferred is not None:  # wrong only where D = C
        return deferred
    return Verdict(True, "q_h . [W_uk[h] c ; rope(k_r)] = (q_h @ W_uk[h]) "
                         ". c + rope(q_r) . rope(k_r), over sqrt(D + R)")


BOUND = catalogue(
    "check_decode_flops_per_byte", 18,
    half_flops=("that is half the count: either a multiply-add counted "
                "as 1 FLOP (it is 2: a score of key_width numbers costs "
                "2 key_width FLOPs, a weighted value 2 value_width) or 4 "
                "bytes per number (float32) where the cache holds "
                "bfloat16, 2 bytes per number", _BOUND),
    numbers=("that divides by numbers, not bytes: each cached number is "
             "2 bytes in bfloat16", _BOUND),
    kv_apart=("that is H L_q: either the values' bytes were counted "
              "apart from the keys' (in MLA they are the keys' first C "
              "numbers, read with them: 2 key_width bytes per token) or "
              "the "
              "weighted values' FLOPs were left out", _BOUND),
    no_new_tokens=("each of the L_q new tokens of every query head "
                   "scores and sums over the whole cache: multiply by "
                   "L_q", _BOUND),
    per_head=("the query heads share one cache: its bytes are read once "
              "for all H heads, not once per head", _BOUND),
    approximate=("that is the approximation 2 H L_q; the count is "
                 "H L_q (key_width + value_width) / key_width", _BOUND),
    inverted=("that is bytes per FLOP: divide the FLOPs by the bytes",
              _BOUND),
    floor_division=("that is rounded down: // is integer (floor) "
                    "division; divide with /, the ratio need not be a "
                    "whole number", _BOUND),
)


def check_decode_flops_per_byte(fn: Callable[..., float]) -> Verdict:
    """Exercise 18.5: ``fn(query_heads, new_tokens, key_width,
    value_width)`` is the FLOPs per byte of cache read by MLA's absorbed
    decoding (FlashMLA's count): per cached token, a score and a weighted
    value for each query head and new token, ``2 h_q s_q (d_k + d_v)``
    FLOPs, over the token's bfloat16 key, ``2 d_k`` bytes, whose first
    ``d_v`` numbers are its value."""
    for heads, new, d_k, d_v in ((4, 3, 10, 6), (32, 1, 576, 512),
                                 (128, 2, 576, 512)):
        call = attempt(fn, heads, new, d_k, d_v)
        if call.verdict is not None:
            return call.verdict
        flops = 2 * heads * new * (d_k + d_v)
        problem = check_number(call.label, call.value, flops / (2 * d_k),
                               rel=1e-9, mistakes=[
            (BOUND["half_flops"], flops / 2 / (2 * d_k)),
            (BOUND["numbers"], flops / d_k),
            (BOUND["kv_apart"], heads * new),
            (BOUND["no_new_tokens"], flops / new / (2 * d_k)),
            (BOUND["per_head"], flops / (2 * d_k * heads)),
            (BOUND["approximate"], 2 * heads * new),
            (BOUND["inverted"], 2 * d_k / flops),
            (BOUND["floor_division"], flops // (2 * d_k)),
        ])
        if problem is not None:
            return problem
    return Verdict(True, "H L_q (key_width + value_width) / key_width "
                         "FLOPs per byte: 2 H L_q (key_width + "
                         "value_width) FLOPs per cached token over its "
                         "2 key_width bytes")


STEP = catalogue(
    "check_absorbed_step", 18,
    position_zero=("the new token comes after the L cached ones: rotate "
                   "its rotary query and its rotary key at position L = "
                   "c.size(1), the cache's length, not at 0", _DECODE),
    not_appended=("the new token attends to itself too: append its "
                  "latent m.kv_down(x) and its rotated rotary key to the "
                  "cached ones before scoring, L + 1 keys in all",
                  _DECODE),
    scale_d=("the scores are scaled by 1/sqrt(D + R), the width of the "
             "explicit form's whole query, not by 1/sqrt(D)", _ROPE),
    query_not_rotated=("the new token's rotary query must be rotated "
                       "too, at position L = c.size(1), as its rotary "
                       "key: apply_rotary(q_r, torch.tensor([L])); an "
                       "unrotated query against rotated keys gives "
                       "scores that depend on each key's position, not "
                       "on the offset", _ROPE),
    rebuilt_keys=("that rebuilds every head's keys from the latents "
                  "(m.k_up on them, or by hand with m.k_up.weight): the "
                  "explicit form. The absorbed step "
                  "rebuilds none: multiply each head's query by its "
                  "W_uk[h] (exercise 18.1) and score it against the "
                  "latents", _ABSORBED),
    rebuilt_values=("that rebuilds every head's values from the latents "
                    "(m.v_up on them, or by hand with m.v_up.weight) "
                    "before the weighted sum: the "
                    "explicit form. The absorbed step sums the latents "
                    "with the weights first, (B, H, 1, C), then applies "
                    "each head's W_uv[h]", _ABSORBED),
    latent_rotated=("the latents carry no positions: rotate only the "
                    "new token's rotary query and rotary key, never its "
                    "latent", _ABSORBED),
    position_off_by_one=("the new token's position is off by one: after "
                         "L cached tokens at positions 0 to L - 1 it sits "
                         "at L = c.size(1), not L - 1 or L + 1", _DECODE),
    rerotated=("the cached rotary keys k_r were rotated a second time: "
               "the cache holds them already rotated, so rotate only the "
               "new token's rotary query and rotary key", _DECODE),
    scale_c_r=("the scores are scaled by 1/sqrt(C + R), the width of the "
               "absorbed query; the scale stays the explicit form's "
               "1/sqrt(D + R), since absorbing changes no score",
               _ABSORBED),
    no_out_proj=("the heads' outputs are merged but not projected: apply "
                 "m.out_proj to the merged (B, 1, H * D) output, as the "
                 "layer does", _ABSORBED),
)


def _step(m: MultiHeadLatentAttention, x: torch.Tensor, c: torch.Tensor,
          k_r: torch.Tensor, *, position: int | None = None,
          append: bool = True, width: int | None = None,
          rotate_latent: bool = False, rerotate: bool = False,
          project: bool = True, rotate_query: bool = True) -> torch.Tensor:
    """One absorbed decoding step of ``m`` for ``x`` ``(B, 1, d_model)``
    after the cached latents ``c`` ``(B, L, C)`` and rotated rotary keys
    ``k_r`` ``(B, L, R)``: ``(B, 1, d_model)``, or with one planted
    mistake (rotated at ``position``, the new token not ``append``-ed, a
    scale over ``sqrt(width)``, the cached rotary keys ``rerotate``-d, no
    ``out_proj`` unless ``project``, the rotary query left unrotated
    unless ``rotate_query``)."""
    heads = m.num_heads
    if rerotate:
        k_r = apply_rotary(k_r, torch.arange(c.size(1)))
    pos = torch.tensor([c.size(1) if position is None else position])
    q = split_heads(m.q_proj(x), heads)  # (B, H, 1, D)
    q_r = split_heads(m.q_rope_proj(x), heads)  # (B, H, 1, R)
    if rotate_query:
        q_r = apply_rotary(q_r, pos)
    if append:  # (B, L + 1, C), (B, L + 1, R)
        latent = m.kv_down(x)  # (B, 1, C)
        if rotate_latent:
            latent = apply_rotary(latent, pos)
        c = torch.cat([c, latent], 1)
        k_r = torch.cat([k_r, apply_rotary(m.k_rope_proj(x), pos)], 1)
    w_uk = m.k_up.weight.unflatten(0, (heads, -1))  # (H, D, C)
    w_uv = m.v_up.weight.unflatten(0, (heads, -1))  # (H, D, C)
    s = (q @ w_uk) @ c[:, None].mT + q_r @ k_r[:, None].mT  # (B, H, 1, L)
    scale = (m.head_dim + m.rope_dim if width is None else width) ** -0.5
    w = (s * scale).softmax(-1)
    o = (w @ c[:, None]) @ w_uv.mT  # (B, H, 1, C) -> (B, H, 1, D)
    o = merge_heads(o)  # (B, 1, H * D)
    return m.out_proj(o) if project else o  # (B, 1, d_model)


def _on_rows(rows: set, args: tuple) -> bool:
    """Whether a call's first argument holds one of ``rows`` (its shape
    without the last axis): a call on every token's latent."""
    return bool(args) and isinstance(args[0], torch.Tensor) \
        and tuple(args[0].shape[:-1]) in rows


def check_absorbed_step(
    fn: Callable[[MultiHeadLatentAttention, torch.Tensor, torch.Tensor,
                  torch.Tensor], torch.Tensor],
) -> Verdict:
    """Exercise 18.6: ``fn(m, x, c, k_r)`` is one absorbed decoding step
    of ``m``: the output ``(B, 1, d_model)`` for a new token ``x``
    ``(B, 1, d_model)`` after ``L`` cached tokens, whose latents ``c``
    ``(B, L, C)`` and rotated rotary keys ``k_r`` ``(B, L, R)`` a
    ``KVCache`` holds; checked against ``m(x, cache=..., absorb=True)``.
    Keys or values rebuilt are refused: a call of ``m.k_up`` or ``m.v_up``
    on the latents, or the keys or values themselves (``c @
    m.k_up.weight.T``) in the reader's code, as in exercise 18.4."""
    generator = torch.Generator().manual_seed(21)
    for d_model, heads, latent, rope, head_dim, length in (
            (8, 2, 4, 2, 4, 3), (12, 3, 6, 4, 2, 5)):
        with torch.random.fork_rng():  # leave the reader's state alone
            torch.manual_seed(21 + d_model)
            m = MultiHeadLatentAttention(d_model, heads, latent, rope,
                                         head_dim=head_dim)
        prompt = torch.randn(2, length, d_model, generator=generator)
        x = torch.randn(2, 1, d_model, generator=generator)
        cache = KVCache()
        with torch.no_grad():
            m(prompt, is_causal=True, cache=cache, need_weights=False)
            c, k_r = cache.values[0][:, 0], cache.keys[0][:, 0]
            expected, _ = m(x, cache=cache, absorb=True,
                            need_weights=False)  # (B, 1, d_model)
        shown = (f"MultiHeadLatentAttention({d_model}, {heads}, {latent}, "
                 f"{rope}, head_dim={head_dim}), x {tuple(x.shape)}, "
                 f"c {tuple(c.shape)}, k_r {tuple(k_r.shape)}")
        # every token's latent, with or without the new one
        on_latents = partial(_on_rows, {(2, length), (2, length + 1)})
        with calls_to(m.k_up, on_latents) as called, \
                calls_to(m.v_up, on_latents) as called_v, torch.no_grad():
            call = attempt(fn, m, x, c.clone(), k_r.clone(), shown=shown)
        if call.verdict is not None:
            return call.verdict
        if called:
            return STEP["rebuilt_keys"].verdict(call.label)
        if called_v:
            return STEP["rebuilt_values"].verdict(call.label)
        with torch.no_grad():
            every = torch.cat([c, m.kv_down(x)], 1)  # (B, L + 1, C)
            for up, name in ((m.k_up, "rebuilt_keys"),
                             (m.v_up, "rebuilt_values")):
                if _rebuilt_by_hand(call.record,
                                    split_heads(up(every), heads)):
                    return STEP[name].verdict(call.label)
            step = partial(_step, m, x, c, k_r)
            problem = check_tensor(
                call.label, call.value, expected, axes="(B, 1, d_model)",
                atol=1e-5, rtol=1e-4, mistakes=[
                    (STEP["position_zero"], partial(step, position=0)),
                    (STEP["not_appended"], partial(step, append=False)),
                    (STEP["scale_d"], partial(step, width=head_dim)),
                    (STEP["latent_rotated"], partial(step,
                                                     rotate_latent=True)),
                    (STEP["position_off_by_one"],
                     partial(step, position=length - 1)),
                    (STEP["position_off_by_one"],
                     partial(step, position=length + 1)),
                    (STEP["rerotated"], partial(step, rerotate=True)),
                    (STEP["query_not_rotated"],
                     partial(step, rotate_query=False)),
                    (STEP["scale_c_r"], partial(step, width=latent + rope)),
                    (STEP["no_out_proj"], partial(step, project=False)),
                ])
        if problem is not None:
            return problem
    return Verdict(True, "W_uk[h] to the query side, multi-query attention "
                         "over [c ; rope(k_r)] with the new token "
                         "appended at position L, over sqrt(D + R), then "
                         "W_uv[h] and out_proj")
