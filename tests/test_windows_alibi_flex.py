"""Sliding windows, ALiBi and FlexAttention (chapter 17), against independent formulas:
a loop over positions for the window mask and for ALiBi, the paper's slopes written out,
a rolling cache whose decode equals full attention with the window mask while its memory
stays flat, and FlexAttention's mask_mod / score_mod (eager, CPU) equal to SDPA with the
dense mask or bias."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from mha_lib import (
    KVCache,
    MultiHeadAttention,
    RotaryAttention,
    alibi_bias,
    padding_mask,
    sliding_window_mask,
)
from mha_lib.alibi import alibi_slopes

param = pytest.mark.parametrize


def window_by_loop(q_len, window, k_len):
    mask = torch.zeros(q_len, k_len, dtype=torch.bool)
    for i in range(q_len):
        p = i + k_len - q_len
        for j in range(k_len):
            mask[i, j] = p - window < j <= p
    return mask


@param("q_len,k_len", [(1, 1), (5, 5), (3, 8), (1, 9), (0, 4)])
@param("window", [1, 2, 3, 100])
def test_sliding_window_mask_equals_a_loop(q_len, k_len, window):
    torch.testing.assert_close(sliding_window_mask(q_len, window, k_len),
                               window_by_loop(q_len, window, k_len))


@param("window", [1, 3, 4])
@param("need_weights", [True, False])
@param("module", ["mha", "rotary"])
def test_rolling_cache_decode_equals_sliding_window_attention(window, need_weights, module):
    torch.manual_seed(0)
    m = (MultiHeadAttention(8, 2) if module == "mha" else RotaryAttention(8, 2)).eval()
    x = torch.randn(2, 10, 8)
    full, _ = m(x, mask=sliding_window_mask(10, window))
    cache = KVCache(window=window)
    outs = [m(x[:, :3], is_causal=True, cache=cache, need_weights=need_weights)[0]]
    outs += [m(x[:, t:t + 1], cache=cache, is_causal=True, need_weights=need_weights)[0]
             for t in range(3, 10)]
    torch.testing.assert_close(torch.cat(outs, 1), full)
    assert cache.kept == min(window - 1, 10) and cache.length == 10


def test_rolling_cache_memory_stays_flat():
    torch.manual_seed(1)
    m = MultiHeadAttention(8, 2).eval()
    cache, full = KVCache(window=4), KVCache()
    sizes, allocated = [], []
    for _ in range(200):
        x = torch.randn(1, 1, 8)
        m(x, cache=cache, need_weights=False)
        full.update(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4))  # no window
        sizes.append(cache.nbytes)
        allocated.append(cache.allocated_nbytes)
    per_token = 2 * 2 * 4 * 4  # keys + values, H_kv * D floats of 4 bytes
    assert sizes[-1] == 3 * per_token == max(sizes)
    assert max(allocated[10:]) == min(allocated[10:])
    assert full.nbytes == 200 * per_token


def test_alibi_slopes_are_the_papers():
    assert alibi_slopes(8) == [2.0 ** -k for k in range(1, 9)]
    assert alibi_slopes(16) == pytest.approx([2.0 ** (-k / 2) for k in range(1, 17)])
    # 12 heads: the 8 slopes of 8 heads, then every other slope of 16 heads
    assert alibi_slopes(12) == alibi_slopes(8) + alibi_slopes(16)[0::2][:4]
    assert alibi_slopes(1) == [2.0 ** -8]


def alibi_by_loop(num_heads, q_len, k_len):
    slopes = alibi_slopes(num_heads)
    bias = torch.zeros(num_heads, q_len, k_len)
    for h in range(num_heads):
        for i in range(q_len):
            for j in range(k_len):
                bias[h, i, j] = -slopes[h] * ((i + k_len - q_len) - j)
    return bias


@param("num_heads,q_len,k_len", [(1, 3, 3), (4, 5, 5), (6, 2, 7), (8, 1, 4)])
def test_alibi_bias_equals_the_papers_formula(num_heads, q_len, k_len):
    torch.testing.assert_close(alibi_bias(num_heads, q_len, k_len),
                               alibi_by_loop(num_heads, q_len, k_len))


@param("need_weights", [True, False])
def test_alibi_through_the_float_mask_path(need_weights):
    torch.manual_seed(2)
    m = MultiHeadAttention(8, 4).eval()
    x = torch.randn(2, 6, 8)
    out, _ = m(x, mask=alibi_bias(4, 6)[None], is_causal=True, need_weights=need_weights)
    q = m.q_proj(x).view(2, 6, 4, 2).transpose(1, 2)
    k = m.k_proj(x).view(2, 6, 4, 2).transpose(1, 2)
    v = m.v_proj(x).view(2, 6, 4, 2).transpose(1, 2)
    scores = q @ k.transpose(-2, -1) / 2 ** 0.5 + alibi_by_loop(4, 6, 6)
    scores = scores.masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), float("-inf"))
    ref = (scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 6, 8)
    torch.testing.assert_close(out, m.out_proj(ref))
    # only the key position matters within a row: softmax ignores a row's constant
    shifted = (torch.tensor(alibi_slopes(4))[:, None, None] * torch.arange(6.0))
    out2, _ = m(x, mask=shifted[None], is_causal=True, need_weights=need_weights)
    torch.testing.assert_close(out2, out)


# --- FlexAttention, eager on CPU ------------------------------------------------------------

@pytest.fixture(autouse=True)
def _quiet_eager_flex():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention.*")
        yield


def qkv(B=2, H=4, L=12, D=8):
    torch.manual_seed(3)
    return (torch.randn(B, H, L, D), torch.randn(B, H, L, D), torch.randn(B, H, L, D))


def test_flex_causal_window_and_padding_equal_sdpa():
    q, k, v = qkv()
    lens = torch.tensor([12, 7])

    def causal(b, h, i, j):
        return i >= j

    def window(b, h, i, j):
        return (i >= j) & (i - j < 4)

    def padding(b, h, i, j):
        return j < lens[b]

    dense = {causal: torch.ones(12, 12, dtype=torch.bool).tril(),
             window: sliding_window_mask(12, 4),
             padding: padding_mask(lens, 12)}
    for mod, mask in dense.items():
        block = create_block_mask(mod, None, None, 12, 12, device="cpu",
                                  BLOCK_SIZE=4)
        got = flex_attention(q, k, v, block_mask=block)
        torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, mask),
                                   atol=1e-5, rtol=1e-5)


def test_flex_alibi_score_mod_equals_the_float_mask():
    q, k, v = qkv()
    slopes = torch.tensor(alibi_slopes(4))

    def alibi(score, b, h, i, j):
        return score + slopes[h] * (j - i)

    def causal(b, h, i, j):
        return i >= j

    block = create_block_mask(causal, None, None, 12, 12, device="cpu", BLOCK_SIZE=4)
    got = flex_attention(q, k, v, score_mod=alibi, block_mask=block)
    bias = alibi_bias(4, 12).masked_fill(~torch.ones(12, 12, dtype=torch.bool).tril(),
                                         float("-inf"))
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, bias),
                               atol=1e-5, rtol=1e-5)
