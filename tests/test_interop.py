"""mha_lib against PyTorch's own attention: nn.MultiheadAttention, F.scaled_dot_product_attention.

nn.MultiheadAttention's bool masks mean the opposite of the project's (True = blocked there),
so the tests pass ``attn_mask=~causal`` and ``key_padding_mask=~valid``.
F.scaled_dot_product_attention's bool mask has the project's meaning (True = may attend).
"""

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.testing import assert_close

from mha_lib import (
    MultiHeadAttention,
    causal_mask,
    from_torch_mha,
    padding_mask,
    scaled_dot_product_attention,
    to_torch_mha,
)

param = pytest.mark.parametrize

CONFIGS = [(8, 2), (12, 3), (16, 1)]
TOL = dict(atol=1e-5, rtol=1e-5)


def _torch_call(t, q, k, v, lib_mask_kind, valid=None, causal=None):
    kwargs = dict(need_weights=True, average_attn_weights=False)
    if lib_mask_kind in ("padding", "both"):
        lk = k.shape[1]
        kwargs["key_padding_mask"] = ~(torch.arange(lk)[None, :] < valid[:, None])  # (B, Lk)
    if lib_mask_kind in ("causal", "both"):
        kwargs["attn_mask"] = ~causal
    with torch.no_grad():
        return t(q, k, v, **kwargs)


def _lib_mask(kind, valid, lq, lk):
    mask = None
    if kind in ("padding", "both"):
        mask = padding_mask(valid, max_len=lk)
    if kind in ("causal", "both"):
        c = causal_mask(lq, lk)
        mask = c if mask is None else mask & c
    return mask


@param("d_model,num_heads", [(8, 2), (12, 3)])
@param("bias", [True, False])
@param("mask_kind", ["none", "padding", "causal", "both"])
@param("lq,lk", [(5, 5), (3, 6), (6, 4)])
def test_to_torch_mha_matches(d_model, num_heads, bias, mask_kind, lq, lk):
    torch.manual_seed(0)
    m = MultiHeadAttention(d_model, num_heads, bias=bias).eval()
    t = to_torch_mha(m).eval()
    assert isinstance(t, nn.MultiheadAttention)
    assert t.batch_first
    assert t.embed_dim == d_model and t.num_heads == num_heads
    B = 2
    q = torch.randn(B, lq, d_model)
    if lq == lk:
        k = v = q  # self-attention
    else:
        k, v = torch.randn(B, lk, d_model), torch.randn(B, lk, d_model)
    valid = torch.tensor([lk, max(1, lk - 2)])
    causal = causal_mask(lq, lk)
    expected, expected_w = _torch_call(t, q, k, v, mask_kind, valid, causal)
    mask = _lib_mask(mask_kind, valid, lq, lk)
    with torch.no_grad():
        out, w = m(q, k, v, mask=mask)
        fused, none = m(q, k, v, mask=mask, need_weights=False)
    assert none is None
    # rows that may attend to something; torch gives NaN for the others (lq > lk causal)
    if mask is None:
        alive = torch.ones(B, lq, dtype=torch.bool)
    else:
        alive = mask.expand(B, 1, lq, lk).any(-1)[:, 0]
    assert_close(out[alive], expected[alive], **TOL)
    assert_close(fused[alive], expected[alive], **TOL)
    assert_close(w.transpose(1, 2)[alive], expected_w.transpose(1, 2)[alive], **TOL)
    # the others: zero attention output, so out_proj's bias (or 0) comes out, on both paths
    dead_value = m.out_proj.bias if bias else torch.zeros(d_model)
    for o in (out, fused):
        assert torch.isfinite(o).all()
        assert_close(o[~alive], dead_value.expand_as(o[~alive]), **TOL)
    assert (w.transpose(1, 2)[~alive] == 0).all()


@param("d_model,num_heads", CONFIGS)
@param("bias", [True, False])
def test_to_torch_mha_weights(d_model, num_heads, bias):
    torch.manual_seed(0)
    m = MultiHeadAttention(d_model, num_heads, bias=bias)
    t = to_torch_mha(m)
    in_w = torch.cat([m.q_proj.weight, m.k_proj.weight, m.v_proj.weight])
    assert_close(t.in_proj_weight, in_w)
    assert_close(t.out_proj.weight, m.out_proj.weight)
    if bias:
        assert_close(t.in_proj_bias, torch.cat([m.q_proj.bias, m.k_proj.bias, m.v_proj.bias]))
        assert_close(t.out_proj.bias, m.out_proj.bias)
    else:
        assert t.in_proj_bias is None and t.out_proj.bias is None


@param("d_model,num_heads", CONFIGS)
@param("bias", [True, False])
@param("mask_kind", ["none", "padding", "causal", "both"])
def test_from_torch_mha_matches(d_model, num_heads, bias, mask_kind):
    torch.manual_seed(0)
    t = nn.MultiheadAttention(d_model, num_heads, bias=bias, batch_first=True).eval()
    if bias:  # PyTorch zero-initialises the biases; make them count
        with torch.no_grad():
            t.in_proj_bias.normal_()
            t.out_proj.bias.normal_()
    m = from_torch_mha(t).eval()
    assert isinstance(m, MultiHeadAttention)
    assert m.d_model == d_model and m.num_heads == num_heads
    assert m.head_dim == d_model // num_heads
    assert_close(m.q_proj.weight, t.in_proj_weight[:d_model])
    assert_close(m.k_proj.weight, t.in_proj_weight[d_model : 2 * d_model])
    assert_close(m.v_proj.weight, t.in_proj_weight[2 * d_model :])
    B, lq, lk = 3, 4, 5
    q, k, v = torch.randn(B, lq, d_model), torch.randn(B, lk, d_model), torch.randn(B, lk, d_model)
    valid = torch.tensor([5, 2, 4])
    expected, expected_w = _torch_call(t, q, k, v, mask_kind, valid, causal_mask(lq, lk))
    with torch.no_grad():
        out, w = m(q, k, v, mask=_lib_mask(mask_kind, valid, lq, lk))
    assert_close(out, expected, **TOL)
    assert_close(w, expected_w, **TOL)


@param("bias", [True, False])
def test_round_trips(bias):
    torch.manual_seed(0)
    t = nn.MultiheadAttention(12, 3, bias=bias, batch_first=True)
    if bias:
        with torch.no_grad():
            t.in_proj_bias.normal_()
            t.out_proj.bias.normal_()
    back = to_torch_mha(from_torch_mha(t))
    sd, sd_back = t.state_dict(), back.state_dict()
    assert sd.keys() == sd_back.keys()
    for key in sd:
        assert_close(sd_back[key], sd[key])

    m = MultiHeadAttention(12, 3, bias=bias)
    m_back = from_torch_mha(to_torch_mha(m))
    sd, sd_back = m.state_dict(), m_back.state_dict()
    assert sd.keys() == sd_back.keys()
    for key in sd:
        assert_close(sd_back[key], sd[key])


def test_to_torch_mha_is_trainable_copy():
    """The converted module has parameters of its own that gradients reach."""
    torch.manual_seed(0)
    m = MultiHeadAttention(8, 2)
    t = to_torch_mha(m)
    x = torch.randn(2, 3, 8)
    out, _ = t(x, x, x)
    out.sum().backward()
    assert t.in_proj_weight.grad is not None and torch.isfinite(t.in_proj_weight.grad).all()
    assert t.in_proj_weight.grad.abs().sum() > 0


# ---------------------------------------------------------------------------------------------
# F.scaled_dot_product_attention
# ---------------------------------------------------------------------------------------------

SDPA_SHAPES = [
    # batch dims, Lq, Lk, D, Dv
    ((2, 3), 4, 6, 5, 7),
    ((2,), 5, 3, 4, 4),
    ((1, 2), 4, 4, 8, 2),
    ((), 3, 5, 6, 3),
]


def _explicit(q, k, v, float_mask=None, bool_mask=None):
    """softmax(q k^T / sqrt(d) + mask) v, written out by hand."""
    scores = torch.einsum("...qd,...kd->...qk", q, k) / math.sqrt(q.shape[-1])
    if float_mask is not None:
        scores = scores + float_mask
    if bool_mask is not None:
        scores = scores.masked_fill(~bool_mask, float("-inf"))
    w = torch.softmax(scores, dim=-1)
    return w @ v, w


@param("batch,lq,lk,d,dv", SDPA_SHAPES)
def test_sdpa_no_mask(batch, lq, lk, d, dv):
    torch.manual_seed(0)
    q, k, v = torch.randn(*batch, lq, d), torch.randn(*batch, lk, d), torch.randn(*batch, lk, dv)
    out, w = scaled_dot_product_attention(q, k, v)
    assert out.shape == (*batch, lq, dv) and w.shape == (*batch, lq, lk)
    assert_close(out, F.scaled_dot_product_attention(q, k, v), **TOL)
    assert_close((out, w), _explicit(q, k, v), **TOL)


@param("batch,lq,lk,d,dv", SDPA_SHAPES)
@param("mask_kind", ["random", "causal", "broadcast_keys"])
def test_sdpa_bool_mask(batch, lq, lk, d, dv, mask_kind):
    torch.manual_seed(0)
    q, k, v = torch.randn(*batch, lq, d), torch.randn(*batch, lk, d), torch.randn(*batch, lk, dv)
    if mask_kind == "random":
        mask = torch.rand(*batch, lq, lk) < 0.6
        mask[..., -1] = True  # no empty rows (torch gives NaN there)
    elif mask_kind == "causal":
        mask = causal_mask(lq, lk).clone()
        mask[:, 0] = True
    else:
        mask = torch.rand(*batch, 1, lk) < 0.6
        mask[..., 0] = True
    out, w = scaled_dot_product_attention(q, k, v, mask=mask)
    assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), **TOL)
    assert_close((out, w), _explicit(q, k, v, bool_mask=mask), **TOL)
    assert (w[(~mask).expand_as(w)] == 0).all()


def test_sdpa_is_causal_matches_causal_mask_square():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 6, 4), torch.randn(2, 3, 6, 4), torch.randn(2, 3, 6, 4)
    out, _ = scaled_dot_product_attention(q, k, v, mask=causal_mask(6))
    assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), **TOL)


@param("batch,lq,lk,d,dv", SDPA_SHAPES)
@param("with_neg_inf", [False, True])
def test_sdpa_float_mask(batch, lq, lk, d, dv, with_neg_inf):
    torch.manual_seed(0)
    q, k, v = torch.randn(*batch, lq, d), torch.randn(*batch, lk, d), torch.randn(*batch, lk, dv)
    mask = torch.randn(*batch, lq, lk) * 2
    if with_neg_inf:
        mask[..., 1:][torch.rand(*batch, lq, lk - 1) < 0.5] = float("-inf")
    out, w = scaled_dot_product_attention(q, k, v, mask=mask)
    assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), **TOL)
    assert_close((out, w), _explicit(q, k, v, float_mask=mask), **TOL)
