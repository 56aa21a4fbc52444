"""Numerics: NaN propagation, fully masked rows, half precision, very large scores.

What is pinned here, and why:

* **NaN is data, not an error.** The library does not look for NaN (a check per call would
  cost a sync on GPUs); it propagates it the way PyTorch does, and the tests below pin where
  it goes. A NaN in query row i reaches only output row i. A NaN in key j reaches only the
  queries that may attend key j on the explicit path (masked scores are *replaced* by
  ``-inf``); PyTorch's ``F.scaled_dot_product_attention``, and so the fused path, *adds*
  ``-inf`` and may spread it further. A NaN in value j reaches **every** query, even those
  that mask key j: their weight is exactly 0 and ``0 * NaN = NaN``, in PyTorch too. So a
  mask does not clean garbage out of padded positions; zero them if they may hold NaN.
* **A row with nothing to attend to** gives zero weights and a zero attention output (the
  module returns ``out_proj.bias`` there), finite gradients, in float32, float16 and bfloat16,
  on both paths.
* **Half precision**: scores are formed and normalised in float32, rounded to half once.
* **Very large scores** (inputs scaled by 1e4) give no inf and no NaN.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from mha_lib import (
    MultiHeadAttention,
    causal_mask,
    masked_softmax,
    padding_mask,
    scaled_dot_product_attention,
    to_torch_mha,
)

param = pytest.mark.parametrize
HALF = [torch.float16, torch.bfloat16]
DTYPES = [torch.float32, *HALF]
TOL = {
    torch.float64: dict(atol=1e-12, rtol=1e-12),
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=5e-3, rtol=5e-3),
    torch.bfloat16: dict(atol=4e-2, rtol=4e-2),
}


def _nan_rows(out: torch.Tensor) -> list[bool]:
    """Which rows (last-but-one axis) of ``out`` (1, L, D) hold a NaN."""
    return out.isnan().any(-1)[0].tolist()


# ---------------------------------------------------------------------------------------------
# NaN propagation: documented, the same as PyTorch where PyTorch is the reference
# ---------------------------------------------------------------------------------------------


def _qkv(gen=None):
    gen = gen or torch.Generator().manual_seed(0)
    return (torch.randn(1, 4, 8, generator=gen), torch.randn(1, 5, 8, generator=gen),
            torch.randn(1, 5, 8, generator=gen))


def test_nan_in_a_query_reaches_only_its_own_output():
    q, k, v = _qkv()
    q[0, 1, 3] = float("nan")
    mask = causal_mask(4, 5)  # (Lq, Lk)
    out, w = scaled_dot_product_attention(q, k, v, mask=mask)
    assert _nan_rows(out) == [False, True, False, False]
    assert _nan_rows(w) == [False, True, False, False]
    # PyTorch's kernel puts it in the same place
    assert _nan_rows(F.scaled_dot_product_attention(q, k, v, attn_mask=mask)) == _nan_rows(out)
    # and so does the module, on both paths, like nn.MultiheadAttention (cross-attention)
    torch.manual_seed(0)
    m = MultiHeadAttention(8, 2).eval()
    with torch.no_grad():
        expected, _ = to_torch_mha(m)(q, k, v, attn_mask=~mask)
        for need_weights in (True, False):
            out_m, _ = m(q, k, v, mask=mask, need_weights=need_weights)
            assert _nan_rows(out_m) == _nan_rows(expected) == [False, True, False, False]


def test_nan_in_a_key_reaches_only_the_queries_that_may_attend_it():
    """Explicit path: queries 0 and 1 may not see key 3 (causal, Lk = Lq + 1) and stay
    finite. PyTorch adds -inf to the NaN score (NaN again), so it may spread further; the
    library replaces masked scores, so it never does."""
    q, k, v = _qkv()
    k[0, 3, 0] = float("nan")
    mask = causal_mask(4, 5)  # query i sees keys 0 .. i+1
    out, w = scaled_dot_product_attention(q, k, v, mask=mask)
    may_attend = mask[:, 3].tolist()  # [False, False, True, True]
    assert _nan_rows(out) == may_attend
    assert _nan_rows(w) == may_attend
    torch_rows = _nan_rows(F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    assert all(t or not ours for t, ours in zip(torch_rows, may_attend, strict=True))


@param("need_weights", [True, False])
def test_nan_in_a_value_reaches_every_query_even_through_a_mask(need_weights):
    """Weight 0 times NaN is NaN: masking key 4 does not keep its NaN value out of any row,
    in the library (both paths) as in PyTorch. Zero padded positions if they may hold NaN."""
    q, k, v = _qkv()
    v[0, 4, 2] = float("nan")
    mask = causal_mask(4, 5)  # only query 3 may attend key 4
    out, w = scaled_dot_product_attention(q, k, v, mask=mask)
    assert (w[0, :3, 4] == 0).all() and torch.isfinite(w).all()
    assert _nan_rows(out) == [True] * 4
    assert _nan_rows(F.scaled_dot_product_attention(q, k, v, attn_mask=mask)) == [True] * 4
    v_clean = v.masked_fill(v.isnan(), 0.0)  # the remedy: clean the data, not the mask
    assert torch.isfinite(scaled_dot_product_attention(q, k, v_clean, mask=mask)[0]).all()
    # self-attention: a NaN token is a value too, so it reaches every position of its
    # sequence, even the earlier ones under a causal mask; other sequences stay finite
    torch.manual_seed(0)
    m = MultiHeadAttention(8, 2).eval()
    x = torch.randn(2, 4, 8)
    x[0, 2, 5] = float("nan")
    with torch.no_grad():
        out_m, _ = m(x, mask=causal_mask(4), need_weights=need_weights)
        expected, _ = to_torch_mha(m)(x, x, x, attn_mask=~causal_mask(4))
    assert out_m[0].isnan().any(-1).all() and torch.isfinite(out_m[1]).all()
    assert expected[0].isnan().any(-1).all() and torch.isfinite(expected[1]).all()


# ---------------------------------------------------------------------------------------------
# Fully masked rows: zeros and finite gradients, every dtype, both paths
# ---------------------------------------------------------------------------------------------


def _dead_rows_mask(kind: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """A (B=2, 1, Lq=4, Lk=5) mask where (b=0, q=1) and (b=1, q=3) see nothing."""
    allowed = torch.ones(2, 1, 4, 5, dtype=torch.bool)
    allowed[0, 0, 1] = allowed[1, 0, 3] = False
    allowed[1, 0, 0, 2:] = False  # partly masked, for contrast
    dead = ~allowed[:, 0].any(-1)  # (B, Lq)
    if kind == "bool":
        return allowed, dead
    return torch.zeros(2, 1, 4, 5, dtype=dtype).masked_fill(~allowed, float("-inf")), dead


@param("dtype", DTYPES)
@param("kind", ["bool", "float"])
@param("need_weights", [True, False])
def test_fully_masked_rows_are_zero_with_finite_gradients(dtype, kind, need_weights):
    torch.manual_seed(0)
    m = MultiHeadAttention(8, 2).to(dtype)
    q = torch.randn(2, 4, 8, dtype=dtype, requires_grad=True)
    kv = torch.randn(2, 5, 8, dtype=dtype, requires_grad=True)
    mask, dead = _dead_rows_mask(kind, dtype)
    out, w = m(q, kv, kv, mask=mask, need_weights=need_weights)
    assert torch.isfinite(out).all()
    assert torch.equal(out[dead], m.out_proj.bias.detach().expand(2, 8))  # out_proj(0), exactly
    if need_weights:
        assert torch.equal(w.transpose(1, 2)[dead], torch.zeros(2, 2, 5, dtype=dtype))
    out.float().pow(2).sum().backward()
    for grad in (q.grad, kv.grad, *(p.grad for p in m.parameters())):
        assert torch.isfinite(grad).all()
    # a query that sees nothing influences nothing: its gradient is exactly zero
    assert (q.grad[dead] == 0).all() and (q.grad[~dead] != 0).any()


@param("dtype", DTYPES)
@param("kind", ["bool", "float"])
def test_fully_masked_rows_in_the_attention_core(dtype, kind):
    torch.manual_seed(0)
    q = torch.randn(2, 1, 4, 6, dtype=dtype, requires_grad=True)
    k = torch.randn(2, 1, 5, 6, dtype=dtype, requires_grad=True)
    v = torch.randn(2, 1, 5, 3, dtype=dtype, requires_grad=True)
    mask, dead = _dead_rows_mask(kind, dtype)
    out, w = scaled_dot_product_attention(q, k, v, mask=mask)
    assert torch.isfinite(out).all() and torch.isfinite(w).all()
    assert (out[:, 0][dead] == 0).all() and (w[:, 0][dead] == 0).all()
    out.float().sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    scores = torch.randn(2, 1, 4, 5, dtype=dtype, requires_grad=True)
    masked_softmax(scores, mask).float().pow(2).sum().backward()
    assert torch.isfinite(scores.grad).all() and (scores.grad[:, 0][dead] == 0).all()


# ---------------------------------------------------------------------------------------------
# Half precision: float32 inside, one rounding at the end
# ---------------------------------------------------------------------------------------------


def _naive_half_softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax written out in the input's dtype, as a first implementation would."""
    e = (x - x.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


@param("dtype", HALF)
def test_half_softmax_is_float32_softmax_rounded_once(dtype):
    """``masked_softmax`` on half scores (with a half additive mask) is exactly the float32
    softmax rounded once to half. Summing scores and mask, or exponentiating, in half
    rounds more often: the written-out half softmax is further from float64."""
    gen = torch.Generator().manual_seed(0)
    scores = (torch.randn(64, 512, generator=gen) * 4).to(dtype)
    add = (torch.randn(64, 512, generator=gen) * 3).to(dtype)  # a float mask: added
    add[torch.rand(64, 512, generator=gen) < 0.2] = float("-inf")
    w = masked_softmax(scores, add)
    assert w.dtype == dtype
    assert torch.equal(w, masked_softmax(scores.float(), add.float()).to(dtype))
    reference = torch.softmax(scores.double() + add.double(), -1)
    ours = (w.double() - reference).abs().max()
    naive = (_naive_half_softmax(scores + add).double() - reference).abs().max()
    assert ours <= naive
    assert ours <= 0.5 * torch.finfo(dtype).eps  # weights < 1: half an ulp of 1 at most


@param("dtype", HALF)
def test_half_attention_is_closer_to_float64_than_naive_half(dtype):
    """Half inputs: scores from float32 products, softmax in float32. Forming the scores in
    half instead (q @ k^T rounded to half, then softmax) is several times further from the
    float64 result on the same inputs."""
    gen = torch.Generator().manual_seed(0)
    q = (torch.randn(4, 64, 64, generator=gen) * 2).to(dtype)
    k = (torch.randn(4, 512, 64, generator=gen) * 2).to(dtype)
    v = torch.randn(4, 512, 64, generator=gen).to(dtype)
    out, w = scaled_dot_product_attention(q, k, v)
    ref_out, ref_w = scaled_dot_product_attention(q.double(), k.double(), v.double())
    naive_w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(64), dim=-1)  # all in half
    err = (w.double() - ref_w).abs().max()
    naive_err = (naive_w.double() - ref_w).abs().max()
    assert err <= 0.5 * torch.finfo(dtype).eps
    assert err * 3 < naive_err
    assert_close(out.double(), ref_out, **TOL[dtype])


# ---------------------------------------------------------------------------------------------
# Very large scores
# ---------------------------------------------------------------------------------------------


@param("dtype", [torch.float64, torch.float32, *HALF])
def test_huge_scores_give_no_inf_or_nan(dtype):
    """Inputs of size 1e4 make scores of order 1e8: beyond float16 (max 65504), far inside
    float32. The attention is then a hard argmax, equal to the float64 result."""
    gen = torch.Generator().manual_seed(0)
    q = (torch.randn(2, 5, 8, generator=gen) * 1e4).to(dtype)
    k = (torch.randn(2, 6, 8, generator=gen) * 1e4).to(dtype)
    v = torch.randn(2, 6, 8, generator=gen).to(dtype)
    mask = causal_mask(5, 6)
    mask_add = torch.zeros(5, 6, dtype=dtype).masked_fill(~mask, float("-inf"))
    ref_out, ref_w = scaled_dot_product_attention(q.double(), k.double(), v.double(), mask=mask)
    for m in (mask, mask_add):
        out, w = scaled_dot_product_attention(q, k, v, mask=m)
        assert torch.isfinite(out).all() and torch.isfinite(w).all()
        assert_close(w.double(), ref_w, **TOL[dtype])
        assert_close(out.double(), ref_out, **TOL[dtype])
    if dtype == torch.float16:  # what the float32 scores avoid
        assert torch.isinf(q @ k.transpose(-2, -1)).any()


@param("dtype", [torch.float32, torch.float16])
@param("need_weights", [True, False])
def test_huge_inputs_through_the_module_stay_finite(dtype, need_weights):
    """The forward pass, on both paths. (In float16 the parameter gradients themselves
    overflow at this scale, x^T @ grad > 65504, so they are checked in float32 only.)"""
    torch.manual_seed(0)
    m = MultiHeadAttention(8, 2).to(dtype)
    x = (torch.randn(2, 5, 8) * 1e4).to(dtype)
    mask = causal_mask(5)
    out, w = m(x, mask=mask, need_weights=need_weights)
    assert torch.isfinite(out).all()
    if need_weights:
        assert torch.isfinite(w).all()
        assert_close(w.double().sum(-1), torch.ones(2, 2, 5, dtype=torch.float64),
                     **TOL[dtype])
    if dtype == torch.float32:
        out.sum().backward()
        assert all(torch.isfinite(p.grad).all() for p in m.parameters())


@pytest.mark.parametrize("float_mask", [False, True])
def test_fused_sdpa_applies_both_mask_and_is_causal(float_mask: bool) -> None:
    """mha.fused_sdpa mirrors F.scaled_dot_product_attention: given a mask and
    is_causal=True, a query sees a key only where both allow (is_causal top-left);
    a row left with nothing gets zeros."""
    from mha_lib.mha import fused_sdpa

    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 3, 5, 8, generator=gen)
    k, v = (torch.randn(2, 3, 7, 8, generator=gen) for _ in range(2))
    mask = torch.rand(2, 1, 5, 7, generator=gen) > 0.3
    mask[:, :, 0] = False  # query 0 sees nothing
    both = mask & torch.ones(5, 7, dtype=torch.bool).tril()
    empty = ~both.any(dim=-1, keepdim=True)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=both | empty)
    want = want.masked_fill(empty, 0.0)
    given = (torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
             if float_mask else mask)
    got = fused_sdpa(q, k, v, given, is_causal=True)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    assert empty.any() and not got.isnan().any()


@pytest.mark.parametrize("float_mask", [False, True])
def test_fused_sdpa_combines_a_padding_mask_with_is_causal(float_mask: bool) -> None:
    """A (B, 1, 1, Lk) padding mask is smaller than the (Lq, Lk) causal one: both
    broadcast to (B, H, Lq, Lk), in bool and in float."""
    from mha_lib.mha import fused_sdpa

    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 3, 6, 8, generator=gen) for _ in range(3))
    pad = padding_mask(torch.tensor([6, 4]))  # (B, 1, 1, Lk)
    both = pad & torch.ones(6, 6, dtype=torch.bool).tril()
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=both)
    given = (torch.zeros(pad.shape).masked_fill(~pad, float("-inf"))
             if float_mask else pad)
    got = fused_sdpa(q, k, v, given, is_causal=True)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
