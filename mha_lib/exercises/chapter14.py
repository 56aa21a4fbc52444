"""Checkers for chapter 14's exercises (the KV cache, grouped-query
attention)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from mha_lib.cache import KVCache
from mha_lib.exercises.verdict import (
    Verdict,
    attempt,
    catalogue,
    check_number,
    check_tensor,
    source_names,
)
from mha_lib.masks import causal_mask

__all__ = ["check_cache_bytes", "check_cache_capacity", "check_expand_kv",
           "check_chunk_mask", "check_cached_step",
           "check_shared_kv_attention"]

_SIZE = "How much memory the cache takes"
_GQA = "Sharing keys and values: multi-query and grouped-query attention"
_ALIGN = "Several new tokens at once: the alignment pitfall"

CACHE = catalogue(
    "check_cache_bytes", 14,
    keys_only=("that is the keys alone; the cache holds the values too",
               _SIZE),
    doubled=("that is twice too large: keys and values are counted "
             "twice; the one factor 2 already covers both", _SIZE),
    no_bytes=("that counts numbers, not bytes: multiply by "
              "bytes_per_number", _SIZE),
    bits=("that counts bits: bytes_per_number is already in bytes", _SIZE),
    one_layer=("that is one layer; every layer has its own cache", _SIZE),
    one_sequence=("that is one sequence; the batch multiplies it", _SIZE),
    no_kv_heads=("that is one key/value head; the cache holds num_kv_heads "
                 "of them in every layer", _SIZE),
    gib=("that is in GiB (or GB); the function returns bytes", _SIZE),
    all_heads=("that counts the 32 query heads H of the 7B-like model; "
               "the cache holds num_kv_heads (H_kv) key/value heads",
               _SIZE),
    kv_heads_twice=("num_kv_heads is counted twice: the cache holds "
                    "num_kv_heads heads per layer, one factor H_kv",
                    _SIZE),
)


def check_cache_bytes(fn: Callable[..., int]) -> Verdict:
    """Exercise 14.1: ``fn(num_layers, num_kv_heads, head_dim, length,
    batch, bytes_per_number)`` is the memory, in bytes, of a full
    :class:`~mha_lib.KVCache`."""
    # The first case has five different factors (2 for keys and values, 5
    # layers, 3 heads, 4 bytes, 7 sequences), so that each one left out
    # gives its own wrong number and its own hint.
    configs = [(5, 3, 4, 6, 7, torch.float32),
               (3, 2, 4, 5, 4, torch.float16),
               (1, 4, 2, 6, 3, torch.float32),
               (2, 2, 4, 5, 1, torch.float16),
               (3, 1, 8, 7, 2, torch.float64)]
    for num_layers, num_kv_heads, head_dim, length, batch, dtype in configs:
        cache = KVCache(num_layers)
        for layer in range(num_layers):
            keys = torch.zeros(batch, num_kv_heads, length, head_dim,
                               dtype=dtype)
            cache.update(keys, keys.clone(), layer)
        args = (num_layers, num_kv_heads, head_dim, length, batch,
                keys.element_size())
        call = attempt(fn, *args)
        if call.verdict is not None:
            return call.verdict
        full = cache.nbytes
        problem = check_number(call.label, call.value, full, mistakes=[
            (CACHE["keys_only"], full // 2),
            (CACHE["doubled"], full * 2),
            (CACHE["no_bytes"], full // keys.element_size()),
            (CACHE["bits"], full * 8),
            (CACHE["one_layer"], full // num_layers),
            (CACHE["one_sequence"], full // batch),
            (CACHE["no_kv_heads"], full // num_kv_heads),
            (CACHE["gib"], full / 2**30),
            (CACHE["gib"], full / 10**9),
            (CACHE["all_heads"], full // num_kv_heads * 32),
            (CACHE["kv_heads_twice"], full * num_kv_heads),
        ])
        if problem is not None:
            return problem
    return Verdict(
        True, "2 (keys and values) x layers x H_kv x D x L x B x bytes "
              "per number")


FITS = catalogue(
    "check_cache_capacity", 14,
    no_weights=("that fills the whole 80 GiB with cache: the weights, "
                "2 x params bytes in float16, stay in memory beside it; "
                "the cache gets what they leave", _SIZE),
    gb=("that takes 80 GB, 80 x 10**9 bytes; the GPU has 80 GiB, "
        "80 x 2**30 bytes", _SIZE),
    rounded_up=("round down (//): part of a sequence, or of a position, "
                "does not fit", _SIZE),
    keys_only=("that counts the keys alone: the cache holds the values "
               "too, 2 x layers x H_kv x D x 2 bytes a token", _SIZE),
    float32_weights=("that counts the weights in float32, 4 bytes a "
                     "parameter; in float16 they take 2 x params bytes",
                     _SIZE),
    float32_cache=("that counts the cache in float32, 4 bytes a number; "
                   "the 7B-like model caches float16, 2 bytes", _SIZE),
    kv_ignored=("fits ignores its argument: every head count gets the "
                "answer for 32 key/value heads; use num_kv_heads in the "
                "bytes of a sequence and of a position", _SIZE),
    swapped=("the two answers are swapped: return (sequences at "
             "L = 4,096, length at batch 32), in that order", _SIZE),
    length_one_sequence=("the length is 32 times too long: divide by "
                         "the bytes of one position for the whole batch "
                         "(batch=32), not for one sequence", _SIZE),
    all_float32=("that counts the model in float32, 4 bytes a number; "
                 "the 7B-like model is float16, 2 bytes: 2 x params "
                 "bytes of weights and bytes_per_number=2 in the cache",
                 _SIZE),
    rounded_weights=("that takes the weights as the rounded 12.6 GiB: use "
                     "the exact 2 x params bytes, not the rounded GiB",
                     _SIZE),
    one_layer=("that is one layer's cache; each of the 32 layers has its "
               "own, so a sequence (or a position) takes 32 times as many "
               "bytes", _SIZE),
    params_bytes=("that counts the weights as params bytes, one byte a "
                  "parameter: a float16 parameter takes 2 bytes, so the "
                  "weights take 2 x params bytes", _SIZE),
)


def _same_numbers(given: tuple, wanted: tuple) -> bool:
    """Whether ``given`` holds the numbers ``wanted``, in that order."""
    try:
        return all(float(a) == float(b) for a, b in zip(given, wanted,
                                                      strict=True))
    except (TypeError, ValueError, RuntimeError):
        return False


def _seven_b_like_params(d=4096, layers=32, d_ff=11008, vocab=32000):
    return layers * (4 * d * d + 3 * d * d_ff + 2 * d) + 2 * vocab * d + d


def check_cache_capacity(fn: Callable[[int], tuple]) -> Verdict:
    """Exercise 14.1, second half: ``fn(num_kv_heads)`` returns, for the
    7B-like model (32 layers, head_dim 128, float16) on an 80 GiB GPU
    beside its float16 weights, ``(sequences, length)``: how many
    sequences of 4,096 tokens fit, and how long a context fits for a
    batch of 32."""
    weights = 2 * _seven_b_like_params()
    for num_kv_heads in (32, 8, 1, 4):
        call = attempt(fn, num_kv_heads)
        if call.verdict is not None:
            return call.verdict
        if not (isinstance(call.value, tuple) and len(call.value) == 2):
            return Verdict(False, f"{call.label} should return a tuple "
                                  "(sequences, length)")
        per_token = 2 * 32 * num_kv_heads * 128 * 2  # bytes, one sequence
        free = 80 * 2**30 - weights
        units = (4096 * per_token, 32 * per_token)
        right = tuple(free // unit for unit in units)
        if _same_numbers(call.value, right[::-1]):
            return FITS["swapped"].verdict(f"{call.label} = {call.value!r}")
        for i, unit in enumerate(units):
            problem = check_number(
                f"{call.label}[{i}]", call.value[i], free // unit,
                mistakes=[
                    (FITS["no_weights"], 80 * 2**30 // unit),
                    *((FITS["rounded_weights"], (80 - gib) * 2**30 // unit)
                      for gib in (12.6, 12.55)),
                    (FITS["gb"], (80 * 10**9 - weights) // unit),
                    (FITS["gb"], 80 * 10**9 // unit),
                    (FITS["rounded_up"], -(-free // unit)),
                    (FITS["rounded_up"], free / unit),
                    (FITS["keys_only"], free // (unit // 2)),
                    (FITS["float32_weights"],
                     (80 * 2**30 - 2 * weights) // unit),
                    (FITS["params_bytes"],
                     (80 * 2**30 - weights // 2) // unit),
                    (FITS["float32_cache"], free // (2 * unit)),
                    (FITS["all_float32"],
                     (80 * 2**30 - 2 * weights) // (2 * unit)),
                    *([(FITS["one_layer"], free // (unit // 32))]
                      if i == 0 else []),
                    *([(FITS["length_one_sequence"], free // (unit // 32))]
                      if i == 1 else []),
                    (FITS["kv_ignored"],
                     free // (unit // num_kv_heads * 32)),
                ])
            if problem is not None:
                return problem
    return Verdict(
        True, "(80 GiB - the weights) // the bytes of one sequence, or of "
              "one position of the whole batch")


EXPAND = catalogue(
    "check_expand_kv", 14,
    tiled=("that tiles the heads (0, 1, 0, 1, ...); query heads 0 and 1 "
           "must share key/value head 0 (0, 0, 1, 1, ...)", _GQA),
    copies_after_length=("the copies went next to the wrong axis: insert "
                         "the group axis right after the head axis, "
                         "x.unsqueeze(2), then merge the two", _GQA),
    view_not_contiguous=("view cannot merge axes that do not lie one "
                         "after the other in memory (expanded copies, or "
                         "keys split into heads by a transpose): use "
                         "reshape", "The way back: `merge_heads`", 5),
    group_size=("that is x unchanged, (B, H_kv, L, D): each key/value "
                "head must appear g = num_heads // H_kv times, one copy "
                "per query head of its group, to give (B, H, L, D)", _GQA),
    batch_axis=("that repeats along the batch axis (dim=0), so each "
                "sequence appears g times: the copies go along the head "
                "axis, repeat_interleave(g, dim=1)", _GQA),
    no_merge=("the group axis is still there, (B, H_kv, g, L, D): merge "
              "it into the head axis with a final reshape to "
              "(B, H, L, D)", _GQA),
    h_copies=("each key/value head is copied H times, H_kv x H heads in "
              "all: copy it g = H / H_kv times (num_heads // x.size(1)), "
              "one copy per query head of its group", _GQA),
    expand_alone=("expand only stretches an axis of size 1, and the head "
                  "axis has H_kv: insert a group axis of size 1 first, "
                  "x.unsqueeze(2), expand it to g, then reshape", _GQA),
    length_axis=("that repeats along the length axis (dim=2), so each "
                 "position appears g times: the copies go along the head "
                 "axis, repeat_interleave(g, dim=1)", _GQA),
)


def _explain_expand(error: BaseException, record) -> object:
    if "view size is not compatible" in str(error):
        return EXPAND["view_not_contiguous"]
    if "expanded size of the tensor" in str(error):
        return EXPAND["expand_alone"]
    return None


def _indexed_heads(record) -> bool:
    """Whether the reader's code picked heads by number: an index of
    integers in ``x[...]``, or ``index_select`` / ``gather``."""
    if record.used(torch.index_select, torch.Tensor.index_select,
                   torch.gather, torch.Tensor.gather):
        return True

    def by_number(item: object) -> bool:
        if isinstance(item, torch.Tensor):
            return item.dim() > 0 and not item.is_floating_point() \
                and item.dtype != torch.bool
        return isinstance(item, list)

    for _, args, _ in record.find(torch.Tensor.__getitem__):
        index = args[1] if len(args) > 1 else None
        items = index if isinstance(index, tuple) else (index,)
        if any(by_number(item) for item in items):
            return True
    return False


def check_expand_kv(
    fn: Callable[[torch.Tensor, int], torch.Tensor],
) -> Verdict:
    """Exercise 14.2: ``fn(x, num_heads)`` turns ``(B, H_kv, L, D)`` into
    ``(B, H, L, D)`` the way :class:`~mha_lib.GroupedQueryAttention` shares
    its key/value heads, also for keys that a transpose made (not
    contiguous). Right values built with ``repeat_interleave`` or by head
    numbers pass, with a nudge towards unsqueeze, expand, reshape."""
    generator = torch.Generator().manual_seed(13)
    other_way = False
    for batch, num_heads, num_kv_heads, length, head_dim in (
        (2, 4, 2, 5, 3), (1, 6, 3, 2, 4), (3, 4, 1, 4, 2), (1, 2, 2, 3, 1),
        (2, 6, 2, 3, 2),
    ):
        # keys as k_proj makes them: (B, L, H_kv * D) split into heads
        x = torch.randn(batch, length, num_kv_heads, head_dim,
                        generator=generator).transpose(1, 2)
        if batch != 2 or num_heads != 6:
            x = x.contiguous()
        group = num_heads // num_kv_heads
        call = attempt(fn, x, num_heads,
                       shown=f"x {tuple(x.shape)}, num_heads={num_heads}",
                       explain=_explain_expand)
        if call.verdict is not None:
            return call.verdict
        expected = x.repeat_interleave(group, dim=1)  # (B, H, L, D)
        if (num_kv_heads > 1 and isinstance(call.value, torch.Tensor)
                and tuple(call.value.shape) == (
                    batch, num_kv_heads * num_heads, length, head_dim)):
            return EXPAND["h_copies"].verdict(call.label)
        if (isinstance(call.value, torch.Tensor) and tuple(call.value.shape)
                == (batch, num_kv_heads, group, length, head_dim)):
            return EXPAND["no_merge"].verdict(call.label)
        if (group > 1 and isinstance(call.value, torch.Tensor)
                and tuple(call.value.shape) == (
                    batch * group, num_kv_heads, length, head_dim)):
            return EXPAND["batch_axis"].verdict(call.label)
        if (group > 1 and isinstance(call.value, torch.Tensor)
                and tuple(call.value.shape) == tuple(x.shape)
                and torch.equal(call.value, x)):
            return Verdict(False, f"{call.label} has shape "
                           f"{tuple(x.shape)}, wanted "
                           f"{tuple(expected.shape)}: "
                           f"{EXPAND['group_size'].message}")
        problem = check_tensor(
            call.label, call.value, expected, axes="(B, H, L, D)",
            atol=0.0, rtol=0.0, mistakes=[
                (EXPAND["tiled"], x.repeat(1, group, 1, 1)),
                (EXPAND["copies_after_length"], x.unsqueeze(3).expand(
                    batch, num_kv_heads, length, group, head_dim).reshape(
                        expected.shape)),
                (EXPAND["group_size"], x),
                (EXPAND["length_axis"], x.repeat_interleave(group, dim=2)),
            ])
        if problem is not None:
            return problem
        other_way = other_way or call.record.used(
            torch.repeat_interleave, torch.Tensor.repeat_interleave
        ) or _indexed_heads(call.record)
    if other_way:
        return Verdict(
            True, "right values, built another way (repeat_interleave or "
                  "heads picked by number); now try Hugging Face's "
                  "repeat_kv construction: unsqueeze, expand, reshape. "
                  "With g > 1 every way copies the heads")
    return Verdict(
        True, "key/value head j serves the query heads j*g to "
              "(j+1)*g - 1, with g = H // H_kv: copies of one head "
              "side by side, as repeat_interleave gives")


CHUNK = catalogue(
    "check_chunk_mask", 14,
    top_left=("the mask is aligned top-left (like SDPA's is_causal=True): "
              "new token i is position past + i and sees the whole cache",
              _ALIGN),
    no_cache=("the keys include the cached ones: the mask is (q_len, "
              "past + q_len)", _ALIGN),
    no_diagonal=("a token may attend itself: j <= past + i, the diagonal "
                 "included", _ALIGN),
    inverted=("the mask is True where a key is hidden; True means \"may "
              "attend\"", _ALIGN),
    one_ahead=("one key too many: tril(past + 1) lets new token i see "
               "position past + i + 1, the token after it; the diagonal "
               "offset is past (j <= past + i)", _ALIGN),
    library=("the values are right, but causal_mask is the library's "
             "answer: build the mask yourself, with torch.arange and a "
             "comparison", _ALIGN),
    not_bool=("the mask should be a bool tensor (True = may attend), "
              "not ints or floats: a comparison such as j <= past + i "
              "gives one", _ALIGN),
    all_ones=("no mask (all True): right for one new token, but in a "
              "chunk of several each token would see the ones after it; "
              "new token i sees keys 0 to past + i", _ALIGN),
    triu=("triu keeps the upper triangle, each token's own key and the "
          "keys after it: the mask is the lower triangle, tril(past), "
          "j <= past + i", _ALIGN),
)


def check_chunk_mask(fn: Callable[[int, int], torch.Tensor]) -> Verdict:
    """Exercise 14.3: ``fn(q_len, past)`` is the bool mask
    ``(q_len, past + q_len)`` for a chunk of ``q_len`` new tokens after
    ``past`` cached ones (True = may attend), built by the reader (with
    ``torch.arange`` and a comparison, or ``tril(past)``), not with the
    library's ``causal_mask``."""
    names = source_names(fn)
    used_tril = False
    for q_len, past in ((3, 4), (1, 5), (1, 0), (4, 0), (2, 7)):
        call = attempt(fn, q_len, past)
        if call.verdict is not None:
            return call.verdict
        expected = causal_mask(q_len, past + q_len)
        ones = torch.ones(q_len, past + q_len, dtype=torch.bool)
        # The values first: a top-left tril is named as the alignment
        # mistake it is, whatever built it (and whatever its dtype).
        value = call.value
        if isinstance(value, torch.Tensor) and value.dtype != torch.bool \
                and value.shape == ones.shape and past \
                and torch.equal(value != 0, ones.tril()):
            return CHUNK["top_left"].verdict(call.label)
        if isinstance(value, torch.Tensor) and value.dtype != torch.bool \
                and value.shape == ones.shape:
            return CHUNK["not_bool"].verdict(call.label)
        problem = check_tensor(
            call.label, call.value, expected, axes="(q_len, past + q_len)",
            mistakes=[
                (CHUNK["top_left"], ones.tril()),
                (CHUNK["no_cache"], causal_mask(q_len)),
                (CHUNK["no_diagonal"], ones.tril(past - 1)),
                (CHUNK["inverted"], ~expected),
                (CHUNK["one_ahead"], ones.tril(past + 1)),
                (CHUNK["all_ones"], ones),
                (CHUNK["triu"], ones.triu(past)),
            ])
        if problem is not None:
            return problem
        if names & {"causal_mask", "sliding_window_mask"}:
            return CHUNK["library"].verdict(call.label)
        used_tril |= bool(call.record.used(
            torch.tril, torch.Tensor.tril, torch.triu, torch.Tensor.triu,
            torch.tril_indices, torch.triu_indices)) \
            or bool(names & {"tril", "triu"})
    if used_tril:
        return Verdict(
            True, "a lower triangle whose diagonal is offset by past "
                  "(as tril(past) builds it) is the bottom-right "
                  "alignment; the comparison j <= past + i says the same "
                  "without a library call")
    return Verdict(
        True, "new token i is position past + i: it sees keys 0 to "
              "past + i, as causal_mask(q_len, past + q_len) does")


_CACHE_SECTION = "The KV cache"

STEP = catalogue(
    "check_cached_step", 14,
    top_left=("the mask is aligned top-left (like SDPA's is_causal=True): "
              "a chunk after cached tokens needs the bottom-right mask, "
              "causal_mask(q_len, k_len)", _ALIGN),
    no_mask=("no mask: right for one new token, but a chunk of several "
             "lets each token see the ones after it; use "
             "causal_mask(q_len, k_len)", _ALIGN),
    new_only=("the new tokens attend only to themselves: concatenate the "
              "cached keys and values in front of the new ones first",
              _CACHE_SECTION),
    new_first=("the new keys and values go after the cached ones, "
               "torch.cat([past, new], dim=2): positions in order",
               _CACHE_SECTION),
    unscaled=("the scores are not scaled: divide q @ k^T by sqrt(D) "
              "before the softmax (SDPA does it for you)",
              "Why divide by $\\sqrt{d_k}$", 6),
    inverted=("the mask is inverted: a bool attn_mask is True where a "
              "key may be attended (masked_fill takes ~mask)", _ALIGN),
    no_diagonal=("the mask leaves out the diagonal: a token may attend "
                 "itself, so new token i sees keys 0 to past + i "
                 "(j <= past + i), as causal_mask(q_len, k_len) does",
                 _ALIGN),
    returned_new=("it returns only the new keys and values: return the "
                  "past ones with the new ones appended, "
                  "torch.cat([past, new], dim=2), the whole cache",
                  _CACHE_SECTION),
    not_appended=("it returns the cached keys or values as they were, "
                  "without the new ones: return torch.cat([past, new], "
                  "dim=2) for the keys and for the values", _CACHE_SECTION),
    cat_axis=("The concatenation is on the wrong axis: positions are "
              "dim 2 of (B, H, L, D), torch.cat([past, new], dim=2)",
              _CACHE_SECTION),
    swapped=("the keys and values are swapped: return (out, keys, "
             "values), the keys second", _CACHE_SECTION),
    square_mask=("The mask covers only the new tokens, (q_len, q_len): "
                 "it must span the cached keys too, causal_mask(q_len, "
                 "past + q_len)", _ALIGN),
    float_mask=("a float attn_mask is added to the scores, not used to "
                "hide keys: SDPA adds your 0s and 1s; pass the bool mask "
                "(True = may attend)", _ALIGN),
    scaled_by_d=("the scores are divided by D: divide q @ k^T by "
                 "sqrt(D), the square root of the head dimension",
                 "Why divide by $\\sqrt{d_k}$", 6),
    softmax_axis=("the softmax runs over the queries (dim -2): each "
                  "query's weights over the keys must sum to 1, "
                  "softmax(dim=-1)", _CACHE_SECTION),
)


def _explain_cat_axis(error, record):
    """A torch.cat on an axis other than the positions' (dim 2) that
    raised: the cat_axis mistake."""
    for _, args, kwargs in record.find(torch.cat, torch.concat,
                                       torch.concatenate):
        dim = kwargs.get("dim", kwargs.get("axis",
                                           args[1] if len(args) > 1 else 0))
        if dim not in (2, -2):
            return STEP["cat_axis"]
    return None


def _explain_step(size: int, end: int):
    """The cat_axis mistake, or a bool mask of the new tokens alone,
    ``(q_len, q_len)``, that the cached keys made fail to broadcast."""
    def explain(error, record):
        mistake = _explain_cat_axis(error, record)
        if mistake is not None or size == end:
            return mistake
        for _, args, kwargs in record.calls:
            for value in (*args, *kwargs.values()):
                if (isinstance(value, torch.Tensor)
                        and value.dtype == torch.bool and value.dim() >= 2
                        and tuple(value.shape[-2:]) == (size, size)):
                    return STEP["square_mask"]
        return None
    return explain


def _reference_step(q, k, v, mask, scale=None, dim=-1):
    scale = q.size(-1) ** -0.5 if scale is None else scale
    weights = q @ k.mT * scale
    if mask is not None:
        weights = weights.masked_fill(~mask, float("-inf"))
    return weights.softmax(dim) @ v


def check_cached_step(fn: Callable[..., tuple]) -> Verdict:
    """Exercise 14.4: ``fn(q, k_new, v_new, past_k, past_v)`` attends the
    new tokens' queries ``(B, H, Lq, D)`` over the cached and new keys and
    values and returns ``(out, keys, values)``: the output ``(B, H, Lq,
    D)`` and the keys and values to cache, ``(B, H, P + Lq, D)``. Fed a
    sequence chunk by chunk (a prompt, then single tokens and a chunk of
    several), its outputs must be the rows of one causal pass over the
    whole sequence."""
    generator = torch.Generator().manual_seed(14)
    B, H, D = 2, 3, 4  # noqa: N806
    chunks = (3, 1, 2, 1, 3)
    total = sum(chunks)
    q, k, v = (torch.randn(B, H, total, D, generator=generator)
               for _ in range(3))
    full = _reference_step(q, k, v, causal_mask(total))  # one causal pass
    start = 0
    for size in chunks:
        end = start + size
        args = (q[:, :, start:end], k[:, :, start:end], v[:, :, start:end],
                k[:, :, :start], v[:, :, :start])
        where = (f"the token at position {start}" if size == 1 else
                 f"the chunk of positions {start} to {end - 1}")
        call = attempt(fn, *args, shown=f"{where}, {start} cached",
                       explain=_explain_step(size, end))
        if call.verdict is not None:
            return call.verdict
        if not (isinstance(call.value, tuple) and len(call.value) == 3):
            return Verdict(False, f"{call.label} should return a tuple "
                                  "(out, keys, values)")
        out, keys, values = call.value
        qn, kn, vn, pk, pv = args
        both_k, both_v = torch.cat([pk, kn], 2), torch.cat([pv, vn], 2)
        strict = torch.ones(size, end, dtype=torch.bool).tril(start - 1)
        mistakes = [
            (STEP["top_left"], _reference_step(
                qn, both_k, both_v,
                torch.ones(size, end, dtype=torch.bool).tril())),
            (STEP["no_mask"], _reference_step(qn, both_k, both_v, None)),
            (STEP["new_only"], _reference_step(qn, kn, vn,
                                               causal_mask(size))),
            (STEP["new_first"], _reference_step(
                qn, torch.cat([kn, pk], 2), torch.cat([vn, pv], 2),
                causal_mask(size, end))),
            (STEP["unscaled"], _reference_step(
                qn, both_k, both_v, causal_mask(size, end), scale=1.0)),
            # an inverted mask: SDPA gives zeros on a row with no key
            # left, a masked_fill and softmax give NaN
            (STEP["inverted"], F.scaled_dot_product_attention(
                qn, both_k, both_v, attn_mask=~causal_mask(size, end))),
            (STEP["inverted"], _reference_step(
                qn, both_k, both_v, ~causal_mask(size, end))),
            # the diagonal left out (j < past + i): the first token of
            # a prompt has no key left (zeros from SDPA, NaN by hand)
            (STEP["no_diagonal"], F.scaled_dot_product_attention(
                qn, both_k, both_v, attn_mask=strict)),
            (STEP["no_diagonal"], _reference_step(
                qn, both_k, both_v, strict)),
            (STEP["float_mask"], F.scaled_dot_product_attention(
                qn, both_k, both_v,
                attn_mask=causal_mask(size, end).float())),
            (STEP["scaled_by_d"], _reference_step(
                qn, both_k, both_v, causal_mask(size, end),
                scale=1.0 / D)),
            (STEP["softmax_axis"], _reference_step(
                qn, both_k, both_v, causal_mask(size, end), dim=-2)),
        ]
        problem = check_tensor(f"{call.label}[0]", out,
                               full[:, :, start:end], axes="(B, H, Lq, D)",
                               mistakes=mistakes)
        if problem is not None:
            return problem
        for name, given, want, other in (("keys", keys, both_k, both_v),
                                         ("values", values, both_v,
                                          both_k)):
            problem = check_tensor(
                f"the {name} tensor it returns", given, want,
                axes="(B, H, P + Lq, D)", atol=0.0, rtol=0.0, mistakes=[
                    (STEP["swapped"], other),
                    (STEP["new_first"], torch.cat(
                        [want[:, :, start:], want[:, :, :start]], 2)),
                    (STEP["returned_new"], want[:, :, start:]),
                    (STEP["not_appended"], want[:, :, :start])])
            if problem is not None:
                return problem
        start = end
    return Verdict(True, "chunk by chunk, the same rows as one causal "
                         "pass: cached keys first, the bottom-right mask")



SHARED = catalogue(
    "check_shared_kv_attention", 14,
    interleaved=("query heads h and h + H_kv share a key/value head (0, 1, "
                 "0, 1, ...): query heads 0 to g - 1 share head 0, so "
                 "reshape q straight to (B, H_kv, g * Lq, D), with no "
                 "transpose", _GQA),
    no_merge=("the result is still in groups, (B, H_kv, g * Lq, D): "
              "reshape it back to (B, H, Lq, D)", _GQA),
    unscaled=("the scores are not scaled: divide q @ k^T by sqrt(D) "
              "before the softmax", "Why divide by $\\sqrt{d_k}$", 6),
    no_mask=("the mask is left out: a chunk of several new tokens must "
             "not see the ones after it", _ALIGN),
    mask_rows=("the mask's rows are in the wrong order: a group's rows "
               "are head 0's Lq queries, then head 1's, so the mask is "
               "repeated as a block, mask.repeat(g, 1), not row by row "
               "(repeat_interleave)", _GQA),
    stacked_by_token=("the queries are stacked token by token (a "
                      "transpose: token 0's g heads, then token 1's), but "
                      "mask.repeat(g, 1) gives head 0's Lq rows, then "
                      "head 1's: the mask's rows must follow the queries' "
                      "order. Reshape q straight to (B, H_kv, g * Lq, D), "
                      "with no transpose", _GQA),
    transposed_first=("q is transposed to (B, Lq, H, D) before the "
                      "reshape, so a group's rows mix tokens and heads: "
                      "query heads 0 to g - 1 are already next to each "
                      "other in (B, H, Lq, D), so reshape q straight to "
                      "(B, H_kv, g * Lq, D), with no transpose", _GQA),
    mask_shape=("the (Lq, Lk) mask does not fit the stacked rows, (g * Lq, "
                "Lk): give it the same rows as the queries, mask.repeat(g, "
                "1)", _GQA),
    copies=("right values, but the key/value heads are copied (repeat, "
            "repeat_interleave or tile on k or v): stack each group's "
            "query heads as rows instead, q.reshape(B, H_kv, g * Lq, D), "
            "and attend over k and v as they are", _GQA),
    copies_expand=("right values, but that is exercise 14.2's expand_kv "
                   "(unsqueeze, expand, reshape, as Hugging Face's "
                   "repeat_kv): the reshape copies each key/value head g "
                   "times. Reshape q instead, q.reshape(B, H_kv, g * Lq, "
                   "D), and attend over k and v as they are", _GQA),
    copies_index=("right values, but picking heads by number, k[:, "
                  "torch.arange(H) // g], builds a new (B, H, Lk, D) "
                  "tensor, a copy of each key/value head g times. Reshape "
                  "q instead, q.reshape(B, H_kv, g * Lq, D)", _GQA),
    copies_broadcast=("right values, but a product over a group axis, "
                      "(B, H_kv, g, Lq, D) @ k[:, :, None], makes matmul "
                      "expand k and v g times into a new tensor. Stack "
                      "the group's heads as rows instead, q.reshape(B, "
                      "H_kv, g * Lq, D): one product per group, no "
                      "broadcast", _GQA),
    tiled=("k.repeat(1, g, 1, 1) tiles the heads (0, 1, 0, 1, ...): "
           "query heads 0 to g - 1 share key/value head 0, and the "
           "exercise asks for no copies at all: reshape q to (B, H_kv, "
           "g * Lq, D)", _GQA),
    top_left=("the mask is aligned top-left (tril, or SDPA's "
              "is_causal=True): the Lq new queries come after Lk - Lq "
              "cached keys, so query i sees keys up to Lk - Lq + i. Use "
              "the bottom-right mask you are given, repeated to the "
              "stacked rows, mask.repeat(g, 1)", _ALIGN),
)

_COPY = (torch.repeat_interleave, torch.Tensor.repeat_interleave,
         torch.Tensor.repeat, torch.tile, torch.Tensor.tile)
_TILE = (torch.Tensor.repeat, torch.tile, torch.Tensor.tile)


def _tensors(tree) -> list[torch.Tensor]:
    """The tensors in nested tuples, lists and dicts of arguments."""
    if isinstance(tree, torch.Tensor):
        return [tree]
    items = tree.values() if isinstance(tree, dict) else tree
    if isinstance(items, (tuple, list)) or isinstance(tree, dict):
        return [t for item in items for t in _tensors(item)]
    return []


_MATMUL = (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__,
           torch.Tensor.__rmatmul__)


class _CopyWatch(TorchFunctionMode):
    """Follows, through every torch function the reader's code calls,
    which tensors come from ``k`` or ``v``, and counts the copies of the
    key/value heads: a new tensor made from them with ``size`` numbers
    (each head once per query head), or a ``matmul`` that broadcasts one of
    them over a group axis (``matmul`` expands it into a new tensor)."""

    def __init__(self, sources, size):
        super().__init__()
        self.marked = {t.untyped_storage().data_ptr() for t in sources}
        self.size, self.copies, self.kept = size, 0, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        given, made = _tensors((args, kwargs)), _tensors(out)
        self.kept += given + made  # no storage freed and reused meanwhile
        inputs = {t.untyped_storage().data_ptr() for t in given}
        ours = [t for t in given
                if t.untyped_storage().data_ptr() in self.marked]
        if not ours:
            return out
        if func in _MATMUL and len(given) == 2 \
                and min(t.dim() for t in given) >= 3:
            batch = torch.broadcast_shapes(*(t.shape[:-2] for t in given))
            self.copies += sum(t.shape[:-2].numel() < batch.numel()
                               for t in ours)
        for t in made:
            ptr = t.untyped_storage().data_ptr()
            if ptr not in inputs and t.numel() == self.size:
                self.copies += 1
            self.marked.add(ptr)
        return out


def _copy_kind(fn) -> object:
    """The copy hint for ``fn``'s way of attending, or None: one call with
    many keys (Lk = 64) under :class:`_CopyWatch`."""
    generator = torch.Generator().manual_seed(16)
    B, H, H_kv, Lq, Lk, D = 2, 4, 2, 3, 64, 5  # noqa: N806
    q = torch.randn(B, H, Lq, D, generator=generator)
    k, v = (torch.randn(B, H_kv, Lk, D, generator=generator)
            for _ in range(2))
    watch = _CopyWatch((k, v), B * H * Lk * D)
    with watch:
        call = attempt(fn, q, k, v, causal_mask(Lq, Lk))
    if call.verdict is not None or not watch.copies:
        return None
    if call.record.used(*_COPY):
        return SHARED["copies"]
    if _indexed_heads(call.record):
        return SHARED["copies_index"]
    if call.record.used(torch.Tensor.expand, torch.Tensor.expand_as):
        return SHARED["copies_expand"]
    return SHARED["copies_broadcast"]


def _explain_shared(error: BaseException, record) -> object:
    text = str(error)
    if "must match the size" in text or "broadcast" in text \
            or "expanded size" in text:
        return SHARED["mask_shape"]
    return None


def _shared_reference(q, k, v, mask, scale=None, interleave=False,
                      mask_by_row=False, by_token=False,
                      transposed_first=False):
    g = q.size(1) // k.size(1)
    if transposed_first:  # (B, Lq, H, D) cut into groups, and back
        B, H, Lq, D = q.shape  # noqa: N806
        rows = q.transpose(1, 2).reshape(B, k.size(1), g * Lq, D)
        out = _reference_step(rows, k, v, mask.repeat(g, 1))
        return out.reshape(B, Lq, H, D).transpose(1, 2)
    if isinstance(mask, str):  # "top_left" or "is_causal": tril
        B, H, Lq, D = q.shape  # noqa: N806
        rows = q.reshape(B, k.size(1), g * Lq, D)
        tril = torch.ones(Lq if mask == "top_left" else g * Lq, k.size(2),
                          dtype=torch.bool).tril()
        tril = tril.repeat(g, 1) if mask == "top_left" else tril
        return _reference_step(rows, k, v, tril).reshape(q.shape)
    if interleave:
        k, v = k.repeat(1, g, 1, 1), v.repeat(1, g, 1, 1)
        return _reference_step(q, k, v, mask, scale)
    if by_token:  # rows stacked token by token, the mask as a block
        B, H, Lq, D = q.shape  # noqa: N806
        rows = q.reshape(B, k.size(1), g, Lq, D).transpose(2, 3)
        out = _reference_step(rows.reshape(B, k.size(1), Lq * g, D), k, v,
                              mask.repeat(g, 1))
        return out.reshape(B, k.size(1), Lq, g, D).transpose(2, 3).reshape(
            q.shape)
    if mask_by_row:  # rows i of head 0, head 1, ... in the wrong order
        B, H, Lq, D = q.shape  # noqa: N806
        rows = q.reshape(B, k.size(1), g * Lq, D)
        out = _reference_step(rows, k, v, mask.repeat_interleave(g, 0))
        return out.reshape(q.shape)
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    return _reference_step(q, k, v, mask, scale)


def check_shared_kv_attention(fn: Callable[..., torch.Tensor]) -> Verdict:
    """Exercise 14.5: ``fn(q, k, v, mask)`` attends queries ``(B, H, Lq,
    D)`` over shared keys and values ``(B, H_kv, Lk, D)`` under a bool
    mask ``(Lq, Lk)`` (True = may attend), query head h reading key/value
    head h // (H // H_kv), and returns ``(B, H, Lq, D)`` without copying
    the key/value heads."""
    generator = torch.Generator().manual_seed(15)
    for B, H, H_kv, Lq, Lk, D in (  # noqa: N806
            (2, 4, 2, 1, 5, 3), (1, 6, 3, 3, 4, 2), (3, 4, 1, 2, 6, 2),
            (2, 6, 2, 3, 5, 3), (1, 2, 2, 2, 3, 4)):
        q = torch.randn(B, H, Lq, D, generator=generator)
        k, v = (torch.randn(B, H_kv, Lk, D, generator=generator)
                for _ in range(2))
        mask = causal_mask(Lq, Lk)
        g = H // H_kv
        call = attempt(fn, q, k, v, mask,
                       shown=f"q {tuple(q.shape)}, k and v "
                             f"{tuple(k.shape)}, mask {tuple(mask.shape)}",
                       explain=_explain_shared)
        if call.verdict is not None:
            return call.verdict
        if (g > 1 and isinstance(call.value, torch.Tensor)
                and tuple(call.value.shape) == (B, H_kv, g * Lq, D)):
            return SHARED["no_merge"].verdict(call.label)
        problem = check_tensor(
            call.label, call.value, _shared_reference(q, k, v, mask),
            axes="(B, H, Lq, D)", mistakes=[
                (SHARED["interleaved"],
                 _shared_reference(q, k, v, mask, interleave=True)),
                (SHARED["mask_rows"],
                 _shared_reference(q, k, v, mask, mask_by_row=True)),
                (SHARED["stacked_by_token"],
                 _shared_reference(q, k, v, mask, by_token=True)),
                (SHARED["transposed_first"],
                 _shared_reference(q, k, v, mask, transposed_first=True)),
                (SHARED["no_mask"], _shared_reference(q, k, v, None)),
                (SHARED["unscaled"],
                 _shared_reference(q, k, v, mask, scale=1.0)),
                (SHARED["top_left"],
                 _shared_reference(q, k, v, "top_left")),
                (SHARED["top_left"],
                 _shared_reference(q, k, v, "is_causal")),
            ])
        if problem is not None:
            if SHARED["interleaved"].message in problem.message and any(
                    isinstance(a[0], torch.Tensor) and a[0].dim() == 4
                    and a[0].shape[1:] == k.shape[1:]
                    for _, a, _ in call.record.find(*_TILE) if a):
                return SHARED["tiled"].verdict(call.label)
            return problem
    copied = _copy_kind(fn)
    if copied is not None:
        return copied.verdict(call.label)
    if any(kwargs.get("enable_gqa") for _, _, kwargs in call.record.find(
            F.scaled_dot_product_attention)):
        return Verdict(True, "SDPA's enable_gqa=True lets query head h "
                             "read key/value head h // g itself, with no "
                             "copy in your code; the page's way shows how: "
                             "each group's g query heads stacked as rows, "
                             "q.reshape(B, H_kv, g * Lq, D)")
    return Verdict(True, "each group's g query heads stacked as rows, "
                         "(B, H_kv, g * Lq, D), the mask repeated to "
                         "match, over the shared key/value head as it is")
