"""Rotary position embeddings (chapter 16), against independent formulations: complex
multiplication, explicit 2x2 rotation matrices, the m - n property, the two layouts and
the permutation between them; rotary attention decoding with a KV cache equals the full
causal forward on both paths."""

from __future__ import annotations

import math

import pytest
import torch

from mha_lib import KVCache, RotaryAttention, apply_rotary, causal_mask

param = pytest.mark.parametrize


def rotary_by_complex(x, positions, base=10000.0):
    """Adjacent pairs (2i, 2i+1) as complex numbers times e^{i m theta_i}."""
    d = x.size(-1)
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (D/2,)
    angles = positions.double()[:, None] * theta  # (L, D/2)
    z = torch.view_as_complex(x.double().unflatten(-1, (d // 2, 2)).contiguous())
    return torch.view_as_real(z * torch.polar(torch.ones_like(angles), angles)).flatten(-2)


def rotary_by_matrices(x, positions, base=10000.0):
    """A block-diagonal matrix of 2x2 rotations per position, adjacent layout."""
    d = x.size(-1)
    out = torch.empty_like(x, dtype=torch.float64)
    for t, m in enumerate(positions.tolist()):
        r = torch.zeros(d, d, dtype=torch.float64)
        for i in range(d // 2):
            a = m * base ** (-2 * i / d)
            r[2 * i:2 * i + 2, 2 * i:2 * i + 2] = torch.tensor(
                [[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]])
        out[..., t, :] = x[..., t, :].double() @ r.T
    return out


def half_to_adjacent(d):
    """Index map: feature k of the adjacent layout is feature perm[k] of the half layout."""
    return torch.stack([torch.arange(d // 2), torch.arange(d // 2) + d // 2], 1).flatten()


@param("d", [2, 4, 8, 16])
@param("base", [10000.0, 500.0])
def test_interleaved_equals_complex_and_matrices(d, base):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, d, dtype=torch.float64)
    pos = torch.tensor([0, 1, 4, 9, 100])
    got = apply_rotary(x, pos, base, interleaved=True)
    torch.testing.assert_close(got, rotary_by_complex(x, pos, base))
    torch.testing.assert_close(got, rotary_by_matrices(x, pos, base))


@param("d", [2, 6, 8])
def test_half_layout_is_the_interleaved_layout_permuted(d):
    torch.manual_seed(1)
    x = torch.randn(4, 7, d, dtype=torch.float64)
    pos = torch.arange(3, 10)
    perm = half_to_adjacent(d)
    got = apply_rotary(x, pos)  # half layout
    adjacent = apply_rotary(x[..., perm], pos, interleaved=True)
    torch.testing.assert_close(got[..., perm], adjacent)
    if d > 2:  # one pair: both layouts are the same
        assert not torch.allclose(got, apply_rotary(x, pos, interleaved=True))


def test_scores_depend_only_on_the_offset():
    torch.manual_seed(2)
    q, k = torch.randn(16, dtype=torch.float64), torch.randn(16, dtype=torch.float64)
    for interleaved in (False, True):
        def score(m, n, interleaved=interleaved):
            qm = apply_rotary(q[None], torch.tensor([m]), interleaved=interleaved)
            kn = apply_rotary(k[None], torch.tensor([n]), interleaved=interleaved)
            return float(qm @ kn.T)
        for m, n in [(5, 2), (3, 0), (103, 100)]:
            assert score(m, n) == pytest.approx(score(m - n, 0), abs=1e-9)
        assert score(5, 2) != pytest.approx(score(5, 3), abs=1e-3)


def test_rotation_keeps_norms_and_position_zero_is_identity():
    torch.manual_seed(3)
    x = torch.randn(2, 6, 8)
    pos = torch.arange(6)
    out = apply_rotary(x, pos)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(out[:, 0], x[:, 0])
    assert out.dtype == x.dtype
    half = apply_rotary(x.bfloat16(), pos)
    assert half.dtype == torch.bfloat16


def test_rotary_attention_matches_a_by_hand_formulation():
    torch.manual_seed(4)
    m = RotaryAttention(16, 4)
    x = torch.randn(2, 5, 16)
    out, weights = m(x, is_causal=True)
    q = m.q_proj(x).view(2, 5, 4, 4).transpose(1, 2)
    k = m.k_proj(x).view(2, 5, 4, 4).transpose(1, 2)
    v = m.v_proj(x).view(2, 5, 4, 4).transpose(1, 2)
    # half layout = adjacent layout on permuted features: rotate by complex numbers
    perm = half_to_adjacent(4)
    inverse = perm.argsort()
    pos = torch.arange(5)
    qr = rotary_by_complex(q[..., perm], pos)[..., inverse].float()
    kr = rotary_by_complex(k[..., perm], pos)[..., inverse].float()
    scores = (qr @ kr.transpose(-2, -1) / 2).masked_fill(~causal_mask(5), float("-inf"))
    ref = (scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 5, 16)
    torch.testing.assert_close(weights, scores.softmax(-1))
    torch.testing.assert_close(out, m.out_proj(ref))


@param("need_weights", [True, False])
@param("num_kv_heads", [None, 2])
@param("chunks", [[1] * 6, [3, 1, 2], [6]])
def test_cached_decoding_equals_full_causal_forward(need_weights, num_kv_heads, chunks):
    torch.manual_seed(5)
    m = RotaryAttention(16, 4, num_kv_heads).eval()
    x = torch.randn(2, 6, 16)
    full, _ = m(x, is_causal=True)
    cache, outs, t = KVCache(), [], 0
    for n in chunks:
        outs.append(m(x[:, t:t + n], is_causal=True, cache=cache,
                      need_weights=need_weights)[0])
        t += n
    torch.testing.assert_close(torch.cat(outs, 1), full)
    assert cache.length == 6


def test_without_rotation_the_cached_decode_breaks():
    """The hook matters: positions must be offset by the cache length."""
    torch.manual_seed(6)
    m = RotaryAttention(8, 2)
    x = torch.randn(1, 4, 8)
    full, _ = m(x, is_causal=True)
    # every token alone, each at position 0: not the same
    alone = torch.cat([m(x[:, t:t + 1])[0] for t in range(4)], 1)
    assert not torch.allclose(alone[:, 1:], full[:, 1:], atol=1e-4)


def test_rotary_attention_options():
    m = RotaryAttention(8, 2, base=500.0, interleaved=True)
    assert (m.base, m.interleaved, m.num_kv_heads) == (500.0, True, 2)
    assert "interleaved=True" in repr(m)


@param("need_weights", [True, False])
@param("num_kv_heads", [None, 2])
def test_a_shorter_query_sits_where_the_causal_mask_puts_it(need_weights, num_kv_heads):
    """One rule for rotation and mask: the keys of a call are positions 0 .. Lk - 1 and the
    queries the last Lq of them (bottom-right, as causal_mask aligns them), with or without
    is_causal, with or without a cache."""
    torch.manual_seed(7)
    m = RotaryAttention(16, 4, num_kv_heads).eval()
    x = torch.randn(2, 6, 16)
    kw = dict(need_weights=need_weights)
    causal, _ = m(x, is_causal=True, **kw)
    for q_len in (1, 2):
        torch.testing.assert_close(m(x[:, -q_len:], x, x, is_causal=True, **kw)[0],
                                   causal[:, -q_len:])
        torch.testing.assert_close(m(x[:, -q_len:], x, x, **kw)[0],
                                   m(x, **kw)[0][:, -q_len:])
    cache = KVCache()
    m(x[:, :2], is_causal=True, cache=cache, **kw)
    torch.testing.assert_close(m(x[:, -1:], x[:, 2:], x[:, 2:], is_causal=True, cache=cache,
                                 **kw)[0], causal[:, -1:])


@param("where", ["apply_rotary", "RotaryAttention", "MultiHeadLatentAttention"])
@param("base", [float("nan"), float("inf"), 1.0, 0.5, True, "1e4"])
def test_a_base_that_is_not_a_finite_number_above_1_is_refused(where, base):
    from mha_lib import MultiHeadLatentAttention

    make = {"apply_rotary": lambda: apply_rotary(torch.randn(3, 4), torch.arange(3), base),
            "RotaryAttention": lambda: RotaryAttention(8, 2, base=base),
            "MultiHeadLatentAttention": lambda: MultiHeadLatentAttention(8, 2, 4, 2,
                                                                         base=base)}
    with pytest.raises(ValueError, match=r"base: expected a finite number > 1, got"):
        make[where]()


@param("start", [0, 10**6, 2**24, 2**30])
def test_late_positions_rotate_as_exactly_as_early_ones(start):
    """float32 angles would round position 2**24 + 1 to 2**24 (and lose the fraction of
    late angles long before): the angles are float64, the rotation float32."""
    torch.manual_seed(8)
    x = torch.randn(2, 5, 8)
    pos = torch.tensor([0, 1, 2, 3, 5]) + start
    perm = half_to_adjacent(8)
    expected = rotary_by_complex(x[..., perm], pos)[..., perm.argsort()].float()
    torch.testing.assert_close(apply_rotary(x, pos), expected, atol=2e-6, rtol=2e-6)
    # neighbouring positions still rotate differently
    assert not torch.allclose(apply_rotary(x, pos)[:, 0], apply_rotary(x, pos + 1)[:, 0])
