"""Properties of mha_lib: the two forward paths, gradients, head reshapes, masks, dtypes."""

import math

import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from mha_lib import (
    MultiHeadAttention,
    PositionalEncoding,
    causal_mask,
    masked_softmax,
    merge_heads,
    padding_mask,
    scaled_dot_product_attention,
    sinusoidal_encoding,
    split_heads,
    transpose_output,
    transpose_qkv,
)

param = pytest.mark.parametrize

TOL = dict(atol=1e-5, rtol=1e-5)
HALF_TOL = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=5e-3, rtol=5e-3),
    torch.bfloat16: dict(atol=5e-2, rtol=5e-2),
}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _reference_mha(m, query, key, value, mask=None):
    """Multi-head attention written out independently from m's four nn.Linear layers."""
    B, Lq, _ = query.shape
    Lk = key.shape[1]
    H, D = m.num_heads, m.d_model // m.num_heads
    q = m.q_proj(query).reshape(B, Lq, H, D).permute(0, 2, 1, 3)
    k = m.k_proj(key).reshape(B, Lk, H, D).permute(0, 2, 1, 3)
    v = m.v_proj(value).reshape(B, Lk, H, D).permute(0, 2, 1, 3)
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(D)
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask
    w = torch.softmax(scores, dim=-1)
    o = torch.einsum("bhqk,bhkd->bhqd", w, v).permute(0, 2, 1, 3).reshape(B, Lq, H * D)
    return m.out_proj(o), w


# (name, Lq, Lk) -> mask; none of these leave a query row empty
def _make_mask(kind, B, H, lq, lk):
    if kind == "none":
        return None
    if kind == "causal":
        return causal_mask(lq, lk) | (torch.arange(lk) == 0)  # (Lq, Lk)
    if kind == "padding":
        return padding_mask(torch.randint(1, lk + 1, (B,)), max_len=lk)  # (B, 1, 1, Lk)
    if kind == "padding2d":
        return padding_mask(torch.randint(1, lk + 1, (B, lq)), max_len=lk)  # (B, 1, Lq, Lk)
    if kind == "per_head":
        mask = torch.rand(B, H, lq, lk) < 0.5
        mask[..., 0] = True
        return mask
    if kind == "float":
        return torch.randn(B, H, lq, lk)
    if kind == "float2d":
        mask = torch.randn(lq, lk)
        mask[:, 1:][torch.rand(lq, lk - 1) < 0.4] = float("-inf")
        return mask
    raise AssertionError(kind)


MASK_KINDS = ["none", "causal", "padding", "padding2d", "per_head", "float", "float2d"]
SHAPES = [(5, 5), (3, 7), (6, 2)]


# ---------------------------------------------------------------------------------------------
# MultiHeadAttention: both paths against an independent reference
# ---------------------------------------------------------------------------------------------


@param("mask_kind", MASK_KINDS)
@param("lq,lk", SHAPES)
@param("d_model,num_heads", [(8, 2), (12, 4)])
def test_fused_and_explicit_paths_agree_with_reference(mask_kind, lq, lk, d_model, num_heads):
    torch.manual_seed(0)
    B = 2
    m = MultiHeadAttention(d_model, num_heads).eval()
    assert (m.d_model, m.num_heads, m.head_dim) == (d_model, num_heads, d_model // num_heads)
    q = torch.randn(B, lq, d_model)
    k, v = torch.randn(B, lk, d_model), torch.randn(B, lk, d_model)
    mask = _make_mask(mask_kind, B, num_heads, lq, lk)
    with torch.no_grad():
        out, w = m(q, k, v, mask=mask)
        fused, none = m(q, k, v, mask=mask, need_weights=False)
        expected, expected_w = _reference_mha(m, q, k, v, mask)
    assert none is None
    assert out.shape == (B, lq, d_model) and w.shape == (B, num_heads, lq, lk)
    assert_close(fused, out, **TOL)
    assert_close(out, expected, **TOL)
    assert_close(w, expected_w, **TOL)


def test_weights_are_softmax_of_scaled_scores_non_square():
    """Catches a wrong scale (sqrt(d_model) vs sqrt(head_dim)), softmax over the query axis,
    and a transposed key: Lq != Lk, and every head has head_dim != d_model."""
    torch.manual_seed(0)
    d_model, H, B, lq, lk = 12, 3, 2, 3, 5
    m = MultiHeadAttention(d_model, H)
    q, kv = torch.randn(B, lq, d_model) * 3, torch.randn(B, lk, d_model) * 3
    with torch.no_grad():
        _, w = m(q, kv, kv)
        Q = m.q_proj(q).view(B, lq, H, 4).transpose(1, 2)
        K = m.k_proj(kv).view(B, lk, H, 4).transpose(1, 2)
        logits = Q @ K.transpose(-1, -2)
    assert w.shape == (B, H, lq, lk)  # a transposed key would give (.., lk, lq)
    assert_close(w, torch.softmax(logits / 2.0, dim=-1), **TOL)  # sqrt(head_dim) = 2
    # the wrong variants are really different here, so the check above has teeth
    assert not torch.allclose(w, torch.softmax(logits / math.sqrt(d_model), dim=-1), atol=1e-3)
    assert not torch.allclose(w, torch.softmax(logits / 2.0, dim=-2), atol=1e-3)


@param("lq,lk,d,dv", [(3, 5, 4, 6), (4, 2, 9, 3), (4, 4, 16, 16)])
def test_sdpa_against_written_out_formula(lq, lk, d, dv):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, lq, d) * 2, torch.randn(2, lk, d) * 2, torch.randn(2, lk, dv)
    out, w = scaled_dot_product_attention(q, k, v)
    logits = torch.zeros(2, lq, lk)
    for b in range(2):
        for i in range(lq):
            for j in range(lk):
                logits[b, i, j] = (q[b, i] * k[b, j]).sum() / math.sqrt(d)
    expected_w = torch.exp(logits) / torch.exp(logits).sum(-1, keepdim=True)
    assert_close(w, expected_w, **TOL)
    assert_close(out, expected_w @ v, **TOL)


@param("mask_kind", ["none", "causal", "padding", "per_head"])
def test_weight_rows_sum_to_one(mask_kind):
    torch.manual_seed(0)
    m = MultiHeadAttention(8, 2)
    q, kv = torch.randn(3, 4, 8), torch.randn(3, 6, 8)
    _, w = m(q, kv, kv, mask=_make_mask(mask_kind, 3, 2, 4, 6))
    assert (w >= 0).all()
    assert_close(w.sum(-1), torch.ones(3, 2, 4))


def test_key_value_default_to_query():
    torch.manual_seed(0)
    m = MultiHeadAttention(8, 2)
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        a, wa = m(x)
        b, wb = m(x, x, x)
        c, _ = m(x, need_weights=False)
    assert_close(a, b)
    assert_close(wa, wb)
    assert_close(c, b, **TOL)


def test_bias_false_has_no_biases():
    torch.manual_seed(0)
    m = MultiHeadAttention(8, 2, bias=False)
    for lin in (m.q_proj, m.k_proj, m.v_proj, m.out_proj):
        assert isinstance(lin, nn.Linear) and lin.bias is None
        assert lin.weight.shape == (8, 8)
    x = torch.randn(1, 3, 8)
    out, _ = m(x)
    assert_close(out, _reference_mha(m, x, x, x)[0], **TOL)


def test_dropout_only_in_training():
    torch.manual_seed(0)
    m = MultiHeadAttention(8, 2, dropout=0.5)
    x = torch.randn(2, 6, 8)
    m.eval()
    with torch.no_grad():
        out, w = m(x)
        expected, expected_w = _reference_mha(m, x, x, x)
    assert_close(out, expected, **TOL)
    assert_close(w, expected_w, **TOL)
    m.train()
    with torch.no_grad():
        out_train, _ = m(x)
    assert not torch.allclose(out_train, expected, atol=1e-4)


def test_sdpa_dropout_callable_is_applied_to_weights():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 6)
    plain, w = scaled_dot_product_attention(q, k, v)
    doubled, _ = scaled_dot_product_attention(q, k, v, dropout=lambda t: 2 * t)
    assert_close(doubled, 2 * plain)
    zero_first = lambda t: t * (torch.arange(5) != 0)  # noqa: E731 - drops key 0
    out, _ = scaled_dot_product_attention(q, k, v, dropout=zero_first)
    assert_close(out, (w * (torch.arange(5) != 0)) @ v)


# ---------------------------------------------------------------------------------------------
# Gradients
# ---------------------------------------------------------------------------------------------


@param("mask_kind", ["none", "bool", "float"])
def test_gradcheck_sdpa(mask_kind):
    torch.manual_seed(0)
    kw = dict(dtype=torch.float64, requires_grad=True)
    q, k, v = torch.randn(2, 3, 4, **kw), torch.randn(2, 5, 4, **kw), torch.randn(2, 5, 3, **kw)
    mask = None
    if mask_kind == "bool":
        mask = torch.rand(2, 3, 5) < 0.6
        mask[..., 0] = True
    elif mask_kind == "float":
        mask = torch.randn(2, 3, 5, dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda a, b, c: scaled_dot_product_attention(a, b, c, mask=mask), (q, k, v), fast_mode=True
    )


@param("need_weights", [True, False])
@param("masked", [False, True])
def test_gradcheck_multihead(need_weights, masked):
    torch.manual_seed(0)
    m = MultiHeadAttention(6, 2).double()
    kw = dict(dtype=torch.float64, requires_grad=True)
    q, kv = torch.randn(2, 3, 6, **kw), torch.randn(2, 4, 6, **kw)
    mask = causal_mask(3, 4) if masked else None

    def f(a, b):
        return m(a, b, b, mask=mask, need_weights=need_weights)[0]

    assert torch.autograd.gradcheck(f, (q, kv), fast_mode=True)


def test_gradients_reach_all_parameters():
    torch.manual_seed(0)
    m = MultiHeadAttention(8, 2)
    q, kv = torch.randn(2, 3, 8), torch.randn(2, 4, 8)
    out, _ = m(q, kv, kv)
    out.pow(2).sum().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None, name
        assert p.grad.abs().sum() > 0, name


# ---------------------------------------------------------------------------------------------
# Head reshapes
# ---------------------------------------------------------------------------------------------


@param("B,L,H,D", [(2, 5, 3, 4), (1, 1, 1, 7), (3, 4, 8, 1)])
def test_split_merge_heads(B, L, H, D):
    torch.manual_seed(0)
    x = torch.randn(B, L, H * D)
    s = split_heads(x, H)
    assert s.shape == (B, H, L, D)
    assert_close(s, x.view(B, L, H, D).transpose(1, 2))
    # element by element: head h holds features h*D .. h*D+D-1
    for h in range(H):
        assert_close(s[:, h], x[..., h * D : (h + 1) * D])
    assert_close(merge_heads(s), x)
    y = torch.randn(B, H, L, D)
    assert merge_heads(y).shape == (B, L, H * D)
    assert_close(split_heads(merge_heads(y), H), y)


@param("B,L,H,D", [(2, 5, 3, 4), (1, 1, 1, 7), (3, 4, 8, 1)])
def test_transpose_qkv_output(B, L, H, D):
    torch.manual_seed(0)
    x = torch.randn(B, L, H * D)
    t = transpose_qkv(x, H)
    assert t.shape == (B * H, L, D)
    for b in range(B):
        for h in range(H):
            assert_close(t[b * H + h], x[b, :, h * D : (h + 1) * D])
    assert_close(transpose_output(t, H), x)


@settings(max_examples=25, deadline=None)
@given(
    B=st.integers(1, 3),
    L=st.integers(1, 5),
    H=st.integers(1, 4),
    D=st.integers(1, 4),
)
def test_head_reshapes_are_inverses(B, L, H, D):
    torch.manual_seed(0)
    x = torch.randn(B, L, H * D)
    assert_close(merge_heads(split_heads(x, H)), x)
    assert_close(transpose_output(transpose_qkv(x, H), H), x)


# ---------------------------------------------------------------------------------------------
# Masks
# ---------------------------------------------------------------------------------------------


@param("lq,lk", [(4, 4), (3, 6), (6, 3), (1, 5)])
def test_causal_mask(lq, lk):
    torch.manual_seed(0)
    mask = causal_mask(lq, lk)
    assert mask.dtype == torch.bool and mask.shape == (lq, lk)
    for i in range(lq):
        for j in range(lk):
            assert bool(mask[i, j]) == (j <= i + lk - lq)
    if lq == lk:
        assert_close(causal_mask(lq), mask)
        assert_close(mask, torch.tril(torch.ones(lq, lq)).bool())


def test_padding_mask():
    torch.manual_seed(0)
    valid = torch.tensor([3, 1, 4])
    m = padding_mask(valid)
    assert m.dtype == torch.bool and m.shape == (3, 1, 1, 4)
    expected = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]]).bool()
    assert_close(m[:, 0, 0], expected)
    assert padding_mask(valid, max_len=6).shape == (3, 1, 1, 6)
    assert not padding_mask(valid, max_len=6)[..., 4:].any()
    valid2 = torch.tensor([[1, 2], [0, 3]])
    m2 = padding_mask(valid2, max_len=3)
    assert m2.shape == (2, 1, 2, 3)
    expected2 = torch.tensor([[[1, 0, 0], [1, 1, 0]], [[0, 0, 0], [1, 1, 1]]]).bool()
    assert_close(m2[:, 0], expected2)


# ---------------------------------------------------------------------------------------------
# masked_softmax and fully masked rows, in three dtypes
# ---------------------------------------------------------------------------------------------


@param("dtype", DTYPES)
def test_masked_softmax(dtype):
    torch.manual_seed(0)
    scores = (torch.randn(2, 3, 5) * 4).to(dtype)
    mask = torch.rand(2, 3, 5) < 0.5
    mask[0, 0] = False  # an empty row
    mask[1, 2] = True
    w = masked_softmax(scores, mask)
    assert w.dtype == dtype
    assert torch.isfinite(w).all()
    expected = torch.softmax(scores.float().masked_fill(~mask, float("-inf")), -1)
    expected = torch.nan_to_num(expected, nan=0.0)
    assert_close(w.float(), expected, **HALF_TOL[dtype])
    assert (w[~mask] == 0).all()
    assert (w[0, 0] == 0).all()
    assert_close(
        masked_softmax(scores).float(), torch.softmax(scores.float(), -1), **HALF_TOL[dtype]
    )


@param("dtype", DTYPES)
def test_masked_softmax_float_mask(dtype):
    torch.manual_seed(0)
    scores = torch.randn(2, 4, 6).to(dtype)
    add = torch.randn(2, 4, 6)
    add[..., :3] = float("-inf")
    add[1, 1] = float("-inf")  # nothing left to attend to
    w = masked_softmax(scores, add.to(dtype))
    assert w.dtype == dtype and torch.isfinite(w).all()
    expected = torch.nan_to_num(torch.softmax(scores.float() + add.to(dtype).float(), -1), nan=0.0)
    assert_close(w.float(), expected, **HALF_TOL[dtype])
    assert (w[1, 1] == 0).all()


def test_masked_softmax_half_computed_in_float32():
    """Half scores plus a half float mask overflow to inf (then NaN) without the float32
    upcast: 60000 + 10000 > 65504, the float16 maximum."""
    torch.manual_seed(0)
    scores = torch.tensor([[60000.0, 0.0, -60000.0]], dtype=torch.float16)
    add = torch.tensor([[10000.0, 0.0, 0.0]], dtype=torch.float16)
    w = masked_softmax(scores, add)
    assert w.dtype == torch.float16
    assert_close(w, torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float16))
    assert_close(masked_softmax(scores), torch.softmax(scores.float(), -1).half())


@param("dtype", [torch.float16, torch.bfloat16])
def test_sdpa_half_large_scores_do_not_overflow(dtype):
    """q.k = 4 * 300 * 300 = 360000 overflows float16; the scores are formed in float32."""
    torch.manual_seed(0)
    q = torch.full((1, 2, 4), 300.0, dtype=dtype)
    k = torch.full((1, 3, 4), 300.0, dtype=dtype)
    v = torch.randn(1, 3, 5).to(dtype)
    out, w = scaled_dot_product_attention(q, k, v)
    assert out.dtype == dtype and w.dtype == dtype
    assert torch.isfinite(out).all() and torch.isfinite(w).all()
    assert_close(w.float(), torch.full((1, 2, 3), 1 / 3), **HALF_TOL[dtype])
    assert_close(out.float(), v.float().mean(1, keepdim=True).expand(1, 2, 5), **HALF_TOL[dtype])


def _fully_masked_setup(dtype, kind):
    m = MultiHeadAttention(8, 2).to(dtype)
    with torch.no_grad():
        m.out_proj.bias.normal_()
    q = torch.randn(2, 4, 8, dtype=dtype, requires_grad=True)
    kv = torch.randn(2, 5, 8, dtype=dtype, requires_grad=True)
    if kind == "bool":
        mask = torch.ones(2, 1, 4, 5, dtype=torch.bool)
        mask[0, 0, 1] = False  # batch 0, query 1 may attend to nothing
        mask[1, 0, 3] = False
        mask[1, 0, 0, 2:] = False  # a partly masked row for contrast
    else:
        mask = torch.zeros(2, 1, 4, 5, dtype=dtype)
        mask[0, 0, 1] = float("-inf")
        mask[1, 0, 3] = float("-inf")
        mask[1, 0, 0, 2:] = float("-inf")
    dead = torch.zeros(2, 4, dtype=torch.bool)
    dead[0, 1] = dead[1, 3] = True
    return m, q, kv, mask, dead


@param("dtype", DTYPES)
@param("need_weights", [True, False])
@param("kind", ["bool", "float"])
def test_fully_masked_rows(dtype, need_weights, kind):
    torch.manual_seed(0)
    m, q, kv, mask, dead = _fully_masked_setup(dtype, kind)
    out, w = m(q, kv, kv, mask=mask, need_weights=need_weights)
    assert out.dtype == dtype
    assert torch.isfinite(out).all()
    bias = m.out_proj.bias.detach()
    assert_close(out[dead].detach(), bias.expand(2, 8), **HALF_TOL[dtype])
    # live rows are ordinary attention
    with torch.no_grad():
        ref_mask = mask if kind == "bool" else mask.float()
        m32 = MultiHeadAttention(8, 2)
        m32.load_state_dict({k: v.float() for k, v in m.state_dict().items()})
        expected, _ = _reference_mha(
            m32, q.detach().float(), kv.detach().float(), kv.detach().float(), ref_mask
        )
    assert_close(out[~dead].detach().float(), expected[~dead], **HALF_TOL[dtype])
    if need_weights:
        assert w.dtype == dtype and torch.isfinite(w).all()
        assert (w.transpose(1, 2)[dead] == 0).all()
        assert_close(w.transpose(1, 2)[~dead].float().sum(-1), torch.ones(6, 2), **HALF_TOL[dtype])
    else:
        assert w is None
    # and no NaN gradients through them
    (out.float() ** 2).sum().backward()
    for t in (q.grad, kv.grad, *(p.grad for p in m.parameters())):
        assert t is not None and torch.isfinite(t).all()


@param("dtype", DTYPES)
def test_sdpa_fully_masked_rows(dtype):
    torch.manual_seed(0)
    q = torch.randn(2, 3, 4, dtype=dtype, requires_grad=True)
    k = torch.randn(2, 5, 4, dtype=dtype, requires_grad=True)
    v = torch.randn(2, 5, 6, dtype=dtype, requires_grad=True)
    mask = torch.ones(2, 3, 5, dtype=torch.bool)
    mask[1, 2] = False
    out, w = scaled_dot_product_attention(q, k, v, mask=mask)
    assert out.dtype == dtype and w.dtype == dtype
    assert torch.isfinite(out).all() and torch.isfinite(w).all()
    assert (out[1, 2] == 0).all() and (w[1, 2] == 0).all()
    out.float().sum().backward()
    for t in (q.grad, k.grad, v.grad):
        assert torch.isfinite(t).all()


# ---------------------------------------------------------------------------------------------
# Causality and padding invariance
# ---------------------------------------------------------------------------------------------


@param("need_weights", [True, False])
@param("t", [0, 2, 5])
def test_causal_future_does_not_leak(need_weights, t):
    torch.manual_seed(0)
    m = MultiHeadAttention(8, 2).eval()
    L = 6
    x = torch.randn(2, L, 8)
    x2 = x.clone()
    x2[:, t + 1 :] = torch.randn(2, L - t - 1, 8) * 5  # change everything after position t
    with torch.no_grad():
        a, _ = m(x, mask=causal_mask(L), need_weights=need_weights)
        b, _ = m(x2, mask=causal_mask(L), need_weights=need_weights)
        c, _ = m(x2, need_weights=need_weights)  # and without the mask it does leak
    assert_close(a[:, : t + 1], b[:, : t + 1], **TOL)
    if t + 1 < L:
        assert not torch.allclose(a[:, : t + 1], c[:, : t + 1], atol=1e-3)


@param("need_weights", [True, False])
def test_padding_invariance(need_weights):
    torch.manual_seed(0)
    m = MultiHeadAttention(8, 2).eval()
    B, lq, lk = 3, 4, 6
    valid = torch.tensor([6, 2, 4])
    q, kv = torch.randn(B, lq, 8), torch.randn(B, lk, 8)
    kv2 = kv.clone()
    for b in range(B):
        n = int(valid[b])
        kv2[b, n:] = torch.randn(lk - n, 8) * 10
    mask = padding_mask(valid, max_len=lk)
    with torch.no_grad():
        a, _ = m(q, kv, kv, mask=mask, need_weights=need_weights)
        b_, _ = m(q, kv2, kv2, mask=mask, need_weights=need_weights)
        assert_close(a, b_, **TOL)
        # and equal to attending over the unpadded keys alone
        for b in range(B):
            n = int(valid[b])
            alone, _ = m(
                q[b : b + 1], kv[b : b + 1, :n], kv[b : b + 1, :n], need_weights=need_weights
            )
            assert_close(a[b : b + 1], alone, **TOL)


# ---------------------------------------------------------------------------------------------
# Positional encoding
# ---------------------------------------------------------------------------------------------


@param("length,d_model", [(7, 6), (1, 2), (50, 32)])
def test_sinusoidal_encoding_formula(length, d_model):
    torch.manual_seed(0)
    pe = sinusoidal_encoding(length, d_model)
    assert pe.dtype == torch.float32 and pe.shape == (length, d_model)
    pos = torch.arange(length, dtype=torch.float64)[:, None]
    i = torch.arange(0, d_model, 2, dtype=torch.float64)
    angle = pos / (10000.0 ** (i / d_model))
    assert_close(pe[:, 0::2].double(), torch.sin(angle), atol=1e-5, rtol=1e-4)
    assert_close(pe[:, 1::2].double(), torch.cos(angle), atol=1e-5, rtol=1e-4)


def test_positional_encoding_forward():
    torch.manual_seed(0)
    pe = PositionalEncoding(6, dropout=0.0, max_len=20)
    x = torch.randn(2, 9, 6)
    assert_close(pe(x), x + sinusoidal_encoding(9, 6))
    pe_drop = PositionalEncoding(6, dropout=0.5, max_len=20).eval()
    assert_close(pe_drop(x), x + sinusoidal_encoding(9, 6))
