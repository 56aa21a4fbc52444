"""Checkers for chapter 18's exercises (multi-head latent attention)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from mha_lib.cache import KVCache
from mha_lib.exercises.verdict import Verdict, close
from mha_lib.latent import MultiHeadLatentAttention

__all__ = ["check_absorbed_query", "check_latent_cache_bytes",
           "check_key_projection"]


def check_absorbed_query(
    fn: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor],
) -> Verdict:
    """Exercise 18.1: ``fn(q, w_uk, num_heads)`` maps queries
    ``(B, H, L, D)`` to the latent space, ``(B, H, L, C)``, so that
    ``fn(q, w_uk, H) @ c.T`` equals ``q @ k.T`` for the keys
    ``k = split_heads(c @ w_uk.T)`` rebuilt from latents ``c`` ``(L, C)``;
    ``w_uk`` is ``k_up.weight``, ``(H * D, C)``."""
    generator = torch.Generator().manual_seed(18)
    for batch, heads, length, head_dim, latent in ((2, 4, 5, 3, 6),
                                                   (1, 2, 3, 4, 2),
                                                   (1, 1, 4, 2, 5)):
        q = torch.randn(batch, heads, length, head_dim, generator=generator)
        w_uk = torch.randn(heads * head_dim, latent, generator=generator)
        c = torch.randn(length, latent, generator=generator)
        keys = (c @ w_uk.T).unflatten(-1, (heads, head_dim)).transpose(0, 1)
        expected = q @ keys.transpose(-2, -1)  # (B, H, L, L)
        what = (f"fn(q {tuple(q.shape)}, w_uk {tuple(w_uk.shape)}, "
                f"{heads}) @ c.T")
        try:
            given = fn(q, w_uk, heads) @ c.T
        except Exception as error:
            # the reader's code: report it, do not crash the notebook
            return Verdict(
                False, f"{what} raised {type(error).__name__}: {error}")
        verdict = close(what, given, expected, "", atol=1e-4, rtol=1e-4)
        if not verdict:
            return verdict
    return Verdict(True, "q_h . (W_uk[h] c) = (W_uk[h]^T q_h) . c: the "
                         "key up-projection moves to the query side")


def check_latent_cache_bytes(fn: Callable[..., int]) -> Verdict:
    """Exercise 18.2: ``fn(kv_latent_dim, rope_dim, length, batch,
    bytes_per_number)`` is the memory, in bytes, of one layer's cache of
    :class:`~mha_lib.MultiHeadLatentAttention` after ``length`` tokens
    (measured: a module fills a real :class:`~mha_lib.KVCache`)."""
    for latent, rope, length, batch, dtype, heads in (
            (6, 2, 5, 2, torch.float32, 4), (4, 4, 3, 1, torch.float64, 2),
            (8, 2, 7, 3, torch.bfloat16, 8)):
        module = MultiHeadLatentAttention(16, heads, latent, rope).to(dtype)
        cache = KVCache()
        module(torch.zeros(batch, length, 16, dtype=dtype), is_causal=True,
               cache=cache)
        args = (latent, rope, length, batch,
                torch.empty((), dtype=dtype).element_size())
        try:
            given = fn(*args)
        except Exception as error:
            # the reader's code: report it, do not crash the notebook
            return Verdict(
                False, f"fn{args} raised {type(error).__name__}: {error}")
        per_head = 2 * heads * (16 // heads) * length * batch * args[-1]
        if given == per_head:
            return Verdict(False, f"fn{args} = {given}: that is a "
                                  f"multi-head cache of keys and values; "
                                  f"this one holds the latent and the "
                                  f"rotary key")
        if given != cache.nbytes:
            return Verdict(False, f"fn{args} should be {cache.nbytes} "
                                  f"(a filled KVCache's nbytes), "
                                  f"got {given!r}")
    return Verdict(True, "(C + R) x L x B x bytes per number, whatever the "
                         "number of heads")


def check_key_projection(
    fn: Callable[[MultiHeadLatentAttention], torch.Tensor],
) -> Verdict:
    """Exercise 18.3: ``fn(module)`` is the one matrix ``W`` ``(H * D,
    d_model)`` with ``k_up(kv_down(x)) = x @ W.T`` (``bias=False``): the
    key projection that the latent factors into two."""
    torch.manual_seed(19)
    for d_model, heads, latent in ((16, 4, 6), (12, 3, 2)):
        module = MultiHeadLatentAttention(d_model, heads, latent, 2)
        x = torch.randn(2, 5, d_model)
        try:
            matrix = fn(module)
        except Exception as error:
            # the reader's code: report it, do not crash the notebook
            return Verdict(False, f"fn(module) raised "
                                  f"{type(error).__name__}: {error}")
        if isinstance(matrix, torch.Tensor) \
                and matrix.shape == (d_model, d_model) \
                and torch.allclose(matrix.T, module.k_up.weight
                                   @ module.kv_down.weight, atol=1e-5):
            return Verdict(False, "fn(module) is transposed: nn.Linear "
                                  "computes x @ weight.T")
        if not isinstance(matrix, torch.Tensor):
            return Verdict(False, f"fn(module) should be a tensor, got "
                                  f"{type(matrix).__name__}")
        if matrix.shape != (d_model, d_model):
            return Verdict(False, f"fn(module) should have shape "
                                  f"(H * D, d_model) = ({d_model}, "
                                  f"{d_model}), got {tuple(matrix.shape)}")
        with torch.no_grad():
            expected = module.k_up(module.kv_down(x))  # (B, L, H * D)
            verdict = close(f"x @ fn(module).T (d_model={d_model})",
                            x @ matrix.detach().T, expected, "",
                            atol=1e-5, rtol=1e-5)
        if not verdict:
            return verdict
    return Verdict(True, "W = k_up.weight @ kv_down.weight, of rank at "
                         "most kv_latent_dim")
