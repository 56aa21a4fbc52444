"""GroupedQueryAttention: equal to MultiHeadAttention when num_kv_heads == num_heads, and to
an independent reference (K/V heads repeated by hand, then PyTorch's SDPA) otherwise."""

import re

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from mha_lib import GroupedQueryAttention, MultiHeadAttention, causal_mask, padding_mask
from mha_lib.exercises.verdict import Recorder

param = pytest.mark.parametrize
TOL = dict(atol=1e-5, rtol=1e-5)


def _reference_gqa(m, query, key, value, mask=None):
    """GQA written out from m's four nn.Linear layers: head h uses K/V head h // group."""
    B, Lq, _ = query.shape
    Lk = key.shape[1]
    H, G = m.num_heads, m.num_kv_heads
    D = m.d_model // H
    q = m.q_proj(query).reshape(B, Lq, H, D).permute(0, 2, 1, 3)  # (B, H, Lq, D)
    k = m.k_proj(key).reshape(B, Lk, G, D).permute(0, 2, 1, 3)  # (B, G, Lk, D)
    v = m.v_proj(value).reshape(B, Lk, G, D).permute(0, 2, 1, 3)
    index = torch.arange(H) // (H // G)  # query head -> its key/value head
    k, v = k[:, index], v[:, index]  # (B, H, Lk, D)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, Lq, D)
    return m.out_proj(out.permute(0, 2, 1, 3).reshape(B, Lq, H * D))


def _masks(B, lq, lk):
    return {
        "none": None,
        "causal": causal_mask(lq, lk) | (torch.arange(lk) == 0),
        "padding": padding_mask(torch.randint(1, lk + 1, (B,)), max_len=lk),
    }


@param("need_weights", [True, False])
@param("mask_kind", ["none", "causal", "padding"])
@param("lq,lk", [(5, 5), (3, 7)])
def test_equal_heads_is_multi_head_attention(need_weights, mask_kind, lq, lk):
    torch.manual_seed(0)
    mha = MultiHeadAttention(12, 4)
    gqa = GroupedQueryAttention(12, 4, num_kv_heads=4)
    gqa.load_state_dict(mha.state_dict())
    query, kv = torch.randn(2, lq, 12), torch.randn(2, lk, 12)
    mask = _masks(2, lq, lk)[mask_kind]
    out_m, w_m = mha(query, kv, kv, mask=mask, need_weights=need_weights)
    out_g, w_g = gqa(query, kv, kv, mask=mask, need_weights=need_weights)
    assert_close(out_g, out_m, atol=0.0, rtol=0.0)
    if need_weights:
        assert_close(w_g, w_m, atol=0.0, rtol=0.0)
    else:
        assert w_g is None and w_m is None
    if lq == lk:  # self-attention (the fused path stacks Q, K, V into one matmul)
        assert_close(gqa(query, mask=mask, need_weights=need_weights)[0],
                     mha(query, mask=mask, need_weights=need_weights)[0], **TOL)


@param("num_heads,num_kv_heads", [(4, 1), (4, 2), (6, 3), (8, 2), (4, 4)])
@param("need_weights", [True, False])
@param("mask_kind", ["none", "causal", "padding"])
def test_against_reference(num_heads, num_kv_heads, need_weights, mask_kind):
    torch.manual_seed(1)
    d_model = 4 * num_heads
    m = GroupedQueryAttention(d_model, num_heads, num_kv_heads)
    x = torch.randn(3, 6, d_model)
    mask = _masks(3, 6, 6)[mask_kind]
    with torch.no_grad():
        expected = _reference_gqa(m, x, x, x, mask)
        self_out, weights = m(x, mask=mask, need_weights=need_weights)
        y = torch.randn(3, 4, d_model)  # cross-attention, Lq != Lk
        cross_mask = None if mask is None else _masks(3, 4, 6)[mask_kind]
        cross_out, _ = m(y, x, x, mask=cross_mask, need_weights=need_weights)
    assert_close(self_out, expected, **TOL)
    assert_close(cross_out, _reference_gqa(m, y, x, x, cross_mask), **TOL)
    if need_weights:
        assert weights.shape == (3, num_heads, 6, 6)
        assert_close(weights.sum(-1), torch.ones(3, num_heads, 6))


def test_query_heads_of_a_group_share_keys():
    """MQA: with equal query projections, all heads give the same weights."""
    torch.manual_seed(2)
    m = GroupedQueryAttention(8, 4, num_kv_heads=1)
    with torch.no_grad():
        m.q_proj.weight.copy_(m.q_proj.weight[:2].repeat(4, 1))  # every head: the same 2 rows
        m.q_proj.bias.copy_(m.q_proj.bias[:2].repeat(4))
        _, w = m(torch.randn(2, 5, 8))
    for h in range(1, 4):
        assert_close(w[:, h], w[:, 0])


def test_projections_are_smaller():
    m = GroupedQueryAttention(64, 8, num_kv_heads=2)
    assert m.q_proj.weight.shape == (64, 64)
    assert m.k_proj.weight.shape == m.v_proj.weight.shape == (16, 64)  # 2 heads of 8
    assert m.k_proj.bias.shape == (16,)
    mha = MultiHeadAttention(64, 8)
    saved = 2 * (64 * 64 + 64) - 2 * (16 * 64 + 16)
    n = sum(p.numel() for p in m.parameters())
    assert n == sum(p.numel() for p in mha.parameters()) - saved
    assert "num_kv_heads=2" in repr(m)
    assert GroupedQueryAttention(8, 2, 1, bias=False).k_proj.bias is None


def test_gradients_reach_all_parameters():
    torch.manual_seed(3)
    m = GroupedQueryAttention(8, 4, num_kv_heads=2)
    for need_weights in (True, False):
        m.zero_grad()
        m(torch.randn(2, 5, 8), mask=causal_mask(5), need_weights=need_weights)[0].sum().backward()
        for name, p in m.named_parameters():
            assert p.grad is not None and p.grad.abs().sum() > 0, name


@param("num_kv_heads", [3, 8, 5])
def test_num_kv_heads_must_divide_num_heads(num_kv_heads):
    with pytest.raises(ValueError) as excinfo:
        GroupedQueryAttention(8, 4, num_kv_heads)
    msg = str(excinfo.value)
    assert msg.startswith("num_kv_heads")
    assert re.search(r"divisor of num_heads=4", msg), msg
    assert f"num_kv_heads={num_kv_heads}" in msg


@param("num_kv_heads", [0, -2, 2.0, True])
def test_num_kv_heads_must_be_a_positive_int(num_kv_heads):
    with pytest.raises(ValueError, match="num_kv_heads: expected a positive int"):
        GroupedQueryAttention(8, 4, num_kv_heads)


def test_bad_input_names_the_argument():
    m = GroupedQueryAttention(8, 4, 2)
    with pytest.raises(ValueError, match=r"query: .*8"):
        m(torch.randn(2, 5, 6))
    with pytest.raises(ValueError, match=r"mask: expected a shape broadcastable to \(B=2, H=4, "
                                         r"Lq=5, Lk=5\)"):
        m(torch.randn(2, 5, 8), mask=causal_mask(4))
    with pytest.raises(ValueError, match="num_heads"):
        GroupedQueryAttention(8, 3, 1)


def _matmul_shapes(recorder: Recorder) -> list[tuple[tuple, tuple]]:
    """The operand shapes of every matrix product (``@``, ``matmul``, ``bmm``) recorded."""
    return [(tuple(args[0].shape), tuple(args[1].shape))
            for func, args, _ in recorder.calls
            if getattr(func, "__name__", "") in ("matmul", "__matmul__", "bmm")]


@param("mask", ["none", "causal", "padding"])
def test_explicit_path_reads_each_key_value_head_without_copies(mask):
    """No product broadcasts K or V across a group: a broadcast batch axis (1 against G)
    makes matmul copy them G times, the multi-head cache size (1,024 cached tokens,
    H = 16, H_kv = 2: 2 MiB of copies for a 0.25 MiB cache), which GQA is there to avoid.
    Checked on a decoding step (one query, cached keys) and on a whole sequence."""
    from mha_lib import KVCache

    torch.manual_seed(0)
    m = GroupedQueryAttention(32, num_heads=8, num_kv_heads=2).eval()
    x = torch.randn(2, 7, 32)
    cache = KVCache()
    with torch.no_grad():
        m(x[:, :6], is_causal=True, cache=cache)
        for query, kwargs in ((x[:, 6:], {"cache": cache}), (x, {})):
            lq, lk = query.size(1), 7
            masks = _masks(2, lq, lk)
            with Recorder() as seen:
                out, weights = m(query, mask=masks[mask], **kwargs)
            assert weights.shape == (2, 8, lq, lk)
            shapes = _matmul_shapes(seen)
            assert shapes, "no matrix product recorded"
            for a, b in shapes:
                assert a[:-2] == b[:-2], f"broadcast product {a} @ {b}: K or V copied"
