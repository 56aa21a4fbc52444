"""Checkers for chapter 14's exercises (the KV cache, grouped-query
attention)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from mha_lib.cache import KVCache
from mha_lib.exercises.verdict import Verdict, close
from mha_lib.masks import causal_mask

__all__ = ["check_cache_bytes", "check_expand_kv", "check_chunk_mask"]


def check_cache_bytes(fn: Callable[..., int]) -> Verdict:
    """Exercise 14.1: ``fn(num_layers, num_kv_heads, head_dim, length,
    batch, bytes_per_number)`` is the memory, in bytes, of a full
    :class:`~mha_lib.KVCache`."""
    configs = [(1, 4, 2, 6, 3, torch.float32),
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
        try:
            given = fn(*args)
        except Exception as error:
            # the reader's code: report it, do not crash the notebook
            return Verdict(
                False, f"fn{args} raised {type(error).__name__}: {error}")
        if given == cache.nbytes // 2:
            return Verdict(
                False, f"fn{args} = {given}: that is the keys alone; "
                       f"the cache holds the values too")
        if given != cache.nbytes:
            return Verdict(
                False, f"fn{args} should be {cache.nbytes} "
                       f"(a filled KVCache's nbytes), got {given!r}")
    return Verdict(
        True, "2 (keys and values) x layers x H_kv x D x L x B x bytes "
              "per number")


def check_expand_kv(
    fn: Callable[[torch.Tensor, int], torch.Tensor],
) -> Verdict:
    """Exercise 14.2: ``fn(x, num_heads)`` turns ``(B, H_kv, L, D)`` into
    ``(B, H, L, D)`` the way :class:`~mha_lib.GroupedQueryAttention` shares
    its key/value heads."""
    generator = torch.Generator().manual_seed(13)
    for batch, num_heads, num_kv_heads, length, head_dim in (
        (2, 4, 2, 5, 3), (1, 6, 3, 2, 4), (3, 4, 1, 4, 2), (1, 2, 2, 3, 1),
    ):
        x = torch.randn(batch, num_kv_heads, length, head_dim,
                        generator=generator)
        group = num_heads // num_kv_heads
        expected = x.repeat_interleave(group, dim=1)  # (B, H, L, D)
        what = f"fn(x of shape {tuple(x.shape)}, num_heads={num_heads})"
        try:
            given = fn(x, num_heads)
        except Exception as error:
            # the reader's code: report it, do not crash the notebook
            return Verdict(
                False, f"{what} raised {type(error).__name__}: {error}")
        tiled = x.repeat(1, group, 1, 1)
        if (isinstance(given, torch.Tensor)
                and given.shape == expected.shape
                and not torch.equal(tiled, expected)
                and torch.equal(given, tiled)):
            return Verdict(
                False, f"{what} tiles the heads (0, 1, 0, 1, ...); "
                       f"query heads 0 and 1 must share key/value head 0 "
                       f"(0, 0, 1, 1, ...)")
        verdict = close(what, given, expected, "", atol=0.0, rtol=0.0)
        if not verdict:
            return verdict
    return Verdict(
        True, "key/value head g serves query heads g*H/H_kv to "
              "(g+1)*H/H_kv - 1, as repeat_interleave gives")


def check_chunk_mask(fn: Callable[[int, int], torch.Tensor]) -> Verdict:
    """Exercise 14.3: ``fn(q_len, past)`` is the bool mask
    ``(q_len, past + q_len)`` for a chunk of ``q_len`` new tokens after
    ``past`` cached ones (True = may attend)."""
    for q_len, past in ((1, 0), (1, 5), (3, 4), (4, 0), (2, 7)):
        expected = causal_mask(q_len, past + q_len)
        try:
            given = fn(q_len, past)
        except Exception as error:
            # the reader's code: report it, do not crash the notebook
            return Verdict(
                False, f"fn({q_len}, {past}) raised "
                       f"{type(error).__name__}: {error}")
        if not isinstance(given, torch.Tensor) or given.dtype != torch.bool:
            return Verdict(
                False, f"fn({q_len}, {past}) should be a bool tensor, got "
                       f"{getattr(given, 'dtype', type(given).__name__)}")
        top_left = torch.ones(q_len, past + q_len, dtype=torch.bool).tril()
        if (past and given.shape == expected.shape
                and torch.equal(given, top_left)):
            return Verdict(
                False, f"fn({q_len}, {past}) is aligned top-left (like "
                       f"SDPA's is_causal=True): the new tokens would not "
                       f"see the cache")
        verdict = close(f"fn({q_len}, {past})", given.float(),
                        expected.float(), "", atol=0.0, rtol=0.0)
        if not verdict:
            return verdict
    return Verdict(
        True, "new token i is position past + i: it sees keys 0 to "
              "past + i, as causal_mask(q_len, past + q_len) does")
