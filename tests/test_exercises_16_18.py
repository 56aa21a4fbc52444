"""Chapters 16-18's checkers accept a right answer and refuse the usual wrong ones."""

from __future__ import annotations

import math

import torch

from mha_lib.exercises import (
    check_absorbed_query,
    check_alibi_slopes,
    check_bidirectional_alibi,
    check_document_window_mod,
    check_key_projection,
    check_latent_cache_bytes,
    check_rotary_complex,
    check_rotate_half,
    check_unturned_pairs,
)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def test_rotate_half():
    assert check_rotate_half(rotate_half)
    swapped = check_rotate_half(lambda x: -rotate_half(x))
    assert not swapped and "signs are swapped" in swapped.message
    assert not check_rotate_half(lambda x: x.flip(-1))
    assert not check_rotate_half(lambda x: 1 / 0)


def rope_complex(x, positions, base=10000.0):
    d = x.size(-1)
    theta = base ** (-torch.arange(0, d, 2).double() / d)
    angles = positions.double()[:, None] * theta
    z = torch.view_as_complex(x.double().unflatten(-1, (d // 2, 2)).contiguous())
    z = z * torch.polar(torch.ones_like(angles), angles)
    return torch.view_as_real(z).flatten(-2).float()


def test_rotary_complex():
    assert check_rotary_complex(rope_complex)
    complex_out = check_rotary_complex(
        lambda x, p: torch.view_as_complex(rope_complex(x, p).unflatten(-1, (-1, 2))))
    assert not complex_out and "complex" in complex_out.message
    from mha_lib import apply_rotary
    halves = check_rotary_complex(lambda x, p: apply_rotary(x, p))
    assert not halves and "adjacent" in halves.message
    assert not check_rotary_complex(lambda x, p: x)


def test_unturned_pairs():
    def right(head_dim, base, length):
        return sum(2 * math.pi * base ** (2 * i / head_dim) > length - 1
                   for i in range(head_dim // 2))

    def wrong(head_dim, base, length):  # forgets the 2 pi
        return sum(base ** (2 * i / head_dim) > length - 1 for i in range(head_dim // 2))

    assert check_unturned_pairs(right)
    assert not check_unturned_pairs(wrong)


def document_window(document_id, window):
    def mask_mod(b, h, q_idx, kv_idx):
        return ((document_id[q_idx] == document_id[kv_idx])
                & (q_idx >= kv_idx) & (q_idx - kv_idx < window))
    return mask_mod


def test_document_window_mod():
    assert check_document_window_mod(document_window)
    leak = check_document_window_mod(
        lambda d, w: lambda b, h, i, j: (i >= j) & (i - j < w))
    assert not leak and "document boundary" in leak.message
    future = check_document_window_mod(
        lambda d, w: lambda b, h, i, j: (d[i] == d[j]) & (i - j < w))
    assert not future and "later keys" in future.message
    not_bool = check_document_window_mod(
        lambda d, w: lambda b, h, i, j: (i - j).float())
    assert not not_bool and "bool" in not_bool.message


def slopes(num_heads):
    def pow2(n):
        return [2 ** (-8 * (h + 1) / n) for h in range(n)]
    p = 2 ** math.floor(math.log2(num_heads))
    return pow2(p) + pow2(2 * p)[0::2][:num_heads - p]


def test_alibi_slopes():
    assert check_alibi_slopes(slopes)
    naive = check_alibi_slopes(lambda n: [2 ** (-8 * (h + 1) / n) for h in range(n)])
    assert not naive and "not a power of two" in naive.message
    assert not check_alibi_slopes(lambda n: [1 / (h + 1) for h in range(n)])


def test_bidirectional_alibi():
    assert check_bidirectional_alibi(
        lambda m: lambda s, b, h, i, j: s - m[h] * (i - j).abs())
    one_sided = check_bidirectional_alibi(
        lambda m: lambda s, b, h, i, j: s + m[h] * (j - i))
    assert not one_sided and "both sides" in one_sided.message
    assert not check_bidirectional_alibi(
        lambda m: lambda s, b, h, i, j: s - m[h] * (i - j) ** 2)


def test_absorbed_query():
    assert check_absorbed_query(lambda q, w, h: q @ w.unflatten(0, (h, -1)))
    # the up-projection applied the wrong way round
    assert not check_absorbed_query(
        lambda q, w, h: q @ w.unflatten(0, (-1, h)).transpose(0, 1))


def test_latent_cache_bytes():
    assert check_latent_cache_bytes(lambda c, r, length, b, n: (c + r) * length * b * n)
    doubled = check_latent_cache_bytes(lambda c, r, length, b, n: 2 * (c + r) * length * b * n)
    assert not doubled
    assert not check_latent_cache_bytes(lambda c, r, length, b, n: c * length * b * n)


def test_key_projection():
    assert check_key_projection(lambda m: m.k_up.weight @ m.kv_down.weight)
    transposed = check_key_projection(lambda m: (m.k_up.weight @ m.kv_down.weight).T)
    assert not transposed and "transposed" in transposed.message
    assert not check_key_projection(lambda m: m.k_up.weight)
