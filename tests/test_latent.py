"""Multi-head latent attention (chapter 18) against an independent formulation written
with einsum from its own weights; the absorbed form equals the explicit one; decoding
with a KVCache equals the full causal forward on both paths, and the cache holds only
the latent and the rotary key; masks and errors behave as in MultiHeadAttention."""

from __future__ import annotations

import pytest
import torch

from mha_lib import (
    KVCache,
    MultiHeadAttention,
    MultiHeadLatentAttention,
    apply_rotary,
    causal_mask,
    padding_mask,
    sliding_window_mask,
)

param = pytest.mark.parametrize


def mla_by_einsum(m, x, mask):
    """DeepSeek-V2's equations (10)-(19) written out per head, no library helpers but
    apply_rotary."""
    B, L, _ = x.shape
    H, D, R = m.num_heads, m.head_dim, m.rope_dim
    pos = torch.arange(L)
    c = m.kv_down(x)  # (B, L, C)
    k_c = torch.einsum("blc,hdc->bhld", c, m.k_up.weight.view(H, D, -1))
    v_c = torch.einsum("blc,hdc->bhld", c, m.v_up.weight.view(H, D, -1))
    k_r = apply_rotary(m.k_rope_proj(x), pos)  # (B, L, R), shared by the heads
    q_c = m.q_proj(x).view(B, L, H, D).permute(0, 2, 1, 3)
    q_r = apply_rotary(m.q_rope_proj(x).view(B, L, H, R).permute(0, 2, 1, 3), pos)
    scores = (torch.einsum("bhid,bhjd->bhij", q_c, k_c)
              + torch.einsum("bhir,bjr->bhij", q_r, k_r)) / (D + R) ** 0.5
    weights = scores.masked_fill(~mask, float("-inf")).softmax(-1)
    o = torch.einsum("bhij,bhjd->bihd", weights, v_c).reshape(B, L, H * D)
    return m.out_proj(o), weights


@param("config", [(16, 4, 6, 4, None), (12, 3, 5, 2, 6), (8, 1, 3, 2, None)])
@param("absorb", [False, True])
@param("need_weights", [True, False])
def test_equals_the_equations(config, absorb, need_weights):
    torch.manual_seed(0)
    d_model, H, C, R, D = config
    m = MultiHeadLatentAttention(d_model, H, C, R, head_dim=D, bias=True)
    x = torch.randn(2, 5, d_model)
    out, weights = m(x, is_causal=True, absorb=absorb, need_weights=need_weights)
    ref, ref_weights = mla_by_einsum(m, x, causal_mask(5))
    torch.testing.assert_close(out, ref)
    if need_weights:
        torch.testing.assert_close(weights, ref_weights)
    else:
        assert weights is None


@param("absorb", [False, True])
@param("need_weights", [True, False])
@param("chunks", [[1] * 6, [2, 3, 1], [6]])
def test_cached_decoding_equals_full_causal_forward(absorb, need_weights, chunks):
    torch.manual_seed(1)
    m = MultiHeadLatentAttention(16, 4, 6, 4).eval()
    x = torch.randn(2, 6, 16)
    full, _ = m(x, is_causal=True)
    cache, outs, t = KVCache(), [], 0
    for n in chunks:
        outs.append(m(x[:, t:t + n], is_causal=True, cache=cache, absorb=absorb,
                      need_weights=need_weights)[0])
        t += n
    torch.testing.assert_close(torch.cat(outs, 1), full)
    # only the rotary key (B, 1, L, R) and the latent (B, 1, L, C)
    assert cache.keys[0].shape == (2, 1, 6, 4)
    assert cache.values[0].shape == (2, 1, 6, 6)
    assert cache.nbytes == 2 * 6 * (4 + 6) * 4
    torch.testing.assert_close(cache.values[0][:, 0], m.kv_down(x))


def test_windowed_cache_equals_the_sliding_window_mask():
    torch.manual_seed(2)
    m = MultiHeadLatentAttention(16, 4, 6, 4).eval()
    x = torch.randn(1, 9, 16)
    full, _ = m(x, mask=sliding_window_mask(9, 3))
    cache = KVCache(window=3)
    outs = [m(x[:, t:t + 1], cache=cache, is_causal=True)[0] for t in range(9)]
    torch.testing.assert_close(torch.cat(outs, 1), full)
    assert cache.kept == 2


@param("need_weights", [True, False])
def test_masks_like_multi_head_attention(need_weights):
    torch.manual_seed(3)
    m = MultiHeadLatentAttention(16, 4, 6, 4).eval()
    x = torch.randn(2, 5, 16)
    pad = padding_mask(torch.tensor([5, 3]))  # (B, 1, 1, Lk)
    a, _ = m(x, mask=pad & causal_mask(5), need_weights=need_weights)
    b, _ = m(x, mask=pad, is_causal=True, need_weights=need_weights)
    torch.testing.assert_close(a, b)
    ref, _ = mla_by_einsum(m, x, pad & causal_mask(5))
    torch.testing.assert_close(a, ref)
    # a fully masked row gives zeros before out_proj, as MultiHeadAttention does
    nothing = torch.zeros(5, 5, dtype=torch.bool)
    out, _ = m(x, mask=nothing, need_weights=need_weights)
    torch.testing.assert_close(out, torch.zeros(2, 5, 16))  # bias=False by default
    float_mask = torch.zeros(5, 5).masked_fill(~causal_mask(5), float("-inf"))
    c, _ = m(x, mask=float_mask, need_weights=need_weights)
    torch.testing.assert_close(c, m(x, is_causal=True)[0])


def test_bad_input_is_refused():
    m = MultiHeadLatentAttention(16, 4, 6, 4)
    x = torch.randn(2, 5, 16)
    with pytest.raises(ValueError, match=r"mask: .*3-D"):
        m(x, mask=torch.ones(2, 5, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"mask: expected is_causal=True"):
        m(x, cache=KVCache())
    with pytest.raises(ValueError, match=r"cache: expected one layer"):
        m(x[:, :1], cache=KVCache(2))
    with pytest.raises(ValueError, match=r"rope_dim: expected an even"):
        MultiHeadLatentAttention(16, 4, 6, 3)
    other = MultiHeadAttention(16, 4)
    cache = KVCache()
    m(x[:, :1], cache=cache)
    with pytest.raises(ValueError, match=r"cache: layer 0"):
        other(x[:, :1], cache=cache)


def test_both_paths_call_the_modules_own_layers():
    m = MultiHeadLatentAttention(16, 4, 6, 4)
    called = []
    for name in ("q_proj", "q_rope_proj", "kv_down", "k_rope_proj", "out_proj"):
        getattr(m, name).register_forward_hook(lambda *a, n=name: called.append(n))
    m(torch.randn(1, 3, 16), is_causal=True, need_weights=False, absorb=True)
    assert sorted(called) == sorted(["q_proj", "q_rope_proj", "kv_down", "k_rope_proj",
                                     "out_proj"])


def test_the_cache_is_smaller_than_multi_head_attentions():
    """C + R numbers per token and layer instead of 2 * H * D."""
    m = MultiHeadLatentAttention(64, 8, 16, 4)
    mha = MultiHeadAttention(64, 8)
    x = torch.randn(1, 10, 64)
    ours, theirs = KVCache(), KVCache()
    m(x, is_causal=True, cache=ours)
    mha(x, is_causal=True, cache=theirs)
    assert ours.nbytes == 10 * (16 + 4) * 4
    assert theirs.nbytes == 10 * 2 * 64 * 4


def test_rotary_and_latent_attention_compile_fullgraph_and_export():
    """Graph capture, as for MultiHeadAttention: no graph breaks, same numbers."""
    from mha_lib import RotaryAttention

    torch.manual_seed(4)
    x = torch.randn(2, 5, 16)
    for module in (RotaryAttention(16, 4, 2).eval(),
                   MultiHeadLatentAttention(16, 4, 6, 4).eval()):
        for need_weights in (True, False):
            def run(t, m=module, nw=need_weights):
                return m(t, is_causal=True, need_weights=nw)[0]
            compiled = torch.compile(run, fullgraph=True, backend="aot_eager")
            torch.testing.assert_close(compiled(x), run(x))

        class Wrapped(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, t):
                return self.m(t, is_causal=True, need_weights=False)[0]

        wrapped = Wrapped(module)
        exported = torch.export.export(wrapped, (x,))
        torch.testing.assert_close(exported.module()(x), wrapped(x))
