"""Properties of attention that hold for every shape, head count, dtype and mask.

Hypothesis draws the sizes (batch, lengths, heads, head dim), the dtype (float64, float32,
float16, bfloat16), the kind of mask and its density, and one integer seed from which every
tensor and every weight is made, so an example is cheap to build and prints in one line.
Runs are deterministic (``derandomize=True``) and keep no example database (``database=None``),
so CI never needs or writes ``.hypothesis/``.

Every property can fail. Its docstring names a one-line bug that breaks it ("Fails when");
each was planted in a scratch copy of ``mha_lib`` (never in the repository) and the property
failed on it. Shape letters: B batch, H heads, Lq/Lk query/key length, D head dim.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from mha_lib import (
    MultiHeadAttention,
    causal_mask,
    masked_softmax,
    merge_heads,
    padding_mask,
    split_heads,
    to_torch_mha,
    transpose_output,
    transpose_qkv,
)

# deterministic, no example database; max_examples is set per test (whole file: a few seconds)
PROPERTY = dict(deadline=None, derandomize=True, database=None)

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
# The same computation on inputs that differ only where they must not matter: (nearly) exact.
SAME = {
    torch.float64: dict(atol=1e-12, rtol=1e-12),
    torch.float32: dict(atol=1e-6, rtol=1e-6),
    torch.float16: dict(atol=1e-3, rtol=1e-3),
    torch.bfloat16: dict(atol=1e-2, rtol=1e-2),
}
# Two different computations of the same value (fused kernel vs explicit path, or PyTorch).
AGREE = {
    torch.float64: dict(atol=1e-10, rtol=1e-10),
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=1e-2, rtol=1e-2),
    torch.bfloat16: dict(atol=6e-2, rtol=6e-2),
}
MASK_KINDS = ["none", "bool", "bool2d", "padding", "float"]


@st.composite
def configs(draw, *, dtypes=DTYPES, masks=MASK_KINDS, min_len=1):
    """Sizes, dtype, mask kind and density, and a seed for all the numbers."""
    return dict(
        B=draw(st.integers(1, 3)),
        Lq=draw(st.integers(min_len, 6)),
        Lk=draw(st.integers(min_len, 6)),
        H=draw(st.integers(1, 4)),
        D=draw(st.integers(1, 4)),
        dtype=draw(st.sampled_from(dtypes)),
        mask=draw(st.sampled_from(masks)),
        keep=draw(st.sampled_from([0.0, 0.3, 0.7, 1.0])),  # probability that a key is visible
        seed=draw(st.integers(0, 2**16)),
    )


def _randn(gen, *shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, generator=gen) * scale).to(dtype)


def _module(c):
    """An eval-mode MultiHeadAttention in c's dtype, its weights drawn from c's seed."""
    with torch.random.fork_rng():
        torch.manual_seed(c["seed"])
        m = MultiHeadAttention(c["H"] * c["D"], c["H"])
    return m.to(c["dtype"]).eval()


def _mask(c, gen, lq, lk):
    """A mask of c's kind: bool (True = may attend) or additive float (0 / -inf), of a shape
    that broadcasts to (B, H, Lq, Lk); rows with nothing visible happen (keep = 0)."""
    B, H, kind, keep = c["B"], c["H"], c["mask"], c["keep"]
    visible = lambda *shape: torch.rand(*shape, generator=gen) < keep  # noqa: E731
    if kind == "none":
        return None
    if kind == "bool":
        return visible(B, H, lq, lk)  # (B, H, Lq, Lk): one mask per head
    if kind == "bool2d":
        return visible(lq, lk)  # (Lq, Lk)
    if kind == "padding":
        lens = torch.randint(0, lk + 1, (B,), generator=gen)  # 0: a sample with no keys
        return padding_mask(lens, max_len=lk)  # (B, 1, 1, Lk)
    add = _randn(gen, B, 1, lq, lk, dtype=c["dtype"])  # (B, 1, Lq, Lk): biases and -inf
    return add.masked_fill(~visible(B, 1, lq, lk), float("-inf"))


def _allowed(mask, shape):
    """Which scores may be attended, as a bool tensor of ``shape``."""
    if mask is None:
        return torch.ones(shape, dtype=torch.bool)
    if mask.dtype != torch.bool:
        mask = mask != float("-inf")
    return mask.expand(shape)


def _with_weights(m, *args, **kwargs):
    with torch.no_grad():
        return m(*args, **kwargs)


# ---------------------------------------------------------------------------------------------
# 1. Attention weights are a distribution over the visible keys
# ---------------------------------------------------------------------------------------------


@settings(max_examples=80, **PROPERTY)
@given(configs())
def test_rows_sum_to_one_or_are_all_zero(c):
    """Each row of the weights is >= 0, exactly 0 on masked keys, and sums to 1 when some key
    is visible; a row with nothing visible is all zeros (never NaN). Checked on
    ``masked_softmax`` and on the weights ``MultiHeadAttention`` returns.

    Fails when: ``masked_softmax`` drops the final ``.masked_fill(empty, 0.0)`` (fully
    masked rows come out uniform, 1/Lk); or softmax runs over ``dim=-2``; or ``~mask`` is
    written ``mask`` (the convention flipped: weight lands on blocked keys).
    """
    gen = torch.Generator().manual_seed(c["seed"])
    B, H, Lq, Lk, dtype = c["B"], c["H"], c["Lq"], c["Lk"], c["dtype"]
    mask = _mask(c, gen, Lq, Lk)
    allowed = _allowed(mask, (B, H, Lq, Lk))
    scores = _randn(gen, B, H, Lq, Lk, dtype=dtype, scale=4.0)
    m = _module(c)
    x, kv = _randn(gen, B, Lq, H * c["D"], dtype=dtype), _randn(gen, B, Lk, H * c["D"], dtype=dtype)
    _, mha_weights = _with_weights(m, x, kv, kv, mask=mask)
    for w in (masked_softmax(scores, mask), mha_weights):
        assert w.shape == (B, H, Lq, Lk) and w.dtype == dtype
        assert torch.isfinite(w).all() and (w >= 0).all()
        assert (w[~allowed] == 0).all(), "weight on a masked key"
        live = allowed.any(-1)  # (B, H, Lq): rows with something to attend to
        assert (w[~live] == 0).all(), "a fully masked row is not all zeros"
        sums = w.double().sum(-1)[live]
        assert_close(sums, torch.ones_like(sums), **AGREE[dtype])


# ---------------------------------------------------------------------------------------------
# 2. Causality: the future never reaches the past
# ---------------------------------------------------------------------------------------------


@settings(max_examples=60, **PROPERTY)
@given(configs(masks=["none"], min_len=2), st.data())
def test_causal_output_ignores_future_tokens(c, data):
    """With ``causal_mask(L)``, changing the tokens after position t changes no output at
    positions <= t, on both paths (explicit and fused).

    Fails when: ``causal_mask`` uses ``diagonal=k_len - q_len + 1`` (each token also sees
    the next one); or the fused path drops ``attn_mask`` (``need_weights=False`` only).
    """
    gen = torch.Generator().manual_seed(c["seed"])
    B, L, d_model, dtype = c["B"], c["Lq"], c["H"] * c["D"], c["dtype"]
    t = data.draw(st.integers(0, L - 2), label="t")
    m = _module(c)
    x = _randn(gen, B, L, d_model, dtype=dtype)
    x_new_future = x.clone()
    x_new_future[:, t + 1 :] = _randn(gen, B, L - t - 1, d_model, dtype=dtype, scale=5.0)
    for need_weights in (True, False):
        a, _ = _with_weights(m, x, mask=causal_mask(L), need_weights=need_weights)
        b, _ = _with_weights(m, x_new_future, mask=causal_mask(L), need_weights=need_weights)
        assert_close(b[:, : t + 1], a[:, : t + 1], **SAME[dtype])


@settings(max_examples=40, **PROPERTY)
@given(configs(dtypes=[torch.float64, torch.float32], masks=["none"]), st.integers(0, 4))
def test_causal_suffix_queries_match_full_sequence(c, extra):
    """Decoding with a cache: the last Lq queries attending all Lk = Lq + extra keys through
    ``causal_mask(Lq, Lk)`` give exactly the last Lq rows of full causal self-attention.

    Fails when: ``causal_mask`` ignores the offset (``diagonal=0``): with Lk > Lq each query
    would stop ``extra`` tokens short of itself.
    """
    gen = torch.Generator().manual_seed(c["seed"])
    B, Lq, dtype = c["B"], c["Lq"], c["dtype"]
    Lk = Lq + extra
    m = _module(c)
    x = _randn(gen, B, Lk, c["H"] * c["D"], dtype=dtype)
    full, w_full = _with_weights(m, x, mask=causal_mask(Lk))
    for need_weights in (True, False):
        tail, w_tail = _with_weights(m, x[:, Lk - Lq :], x, x, mask=causal_mask(Lq, Lk),
                                     need_weights=need_weights)
        assert_close(tail, full[:, Lk - Lq :], **AGREE[dtype])
        if need_weights:
            assert_close(w_tail, w_full[:, :, Lk - Lq :], **AGREE[dtype])


# ---------------------------------------------------------------------------------------------
# 3. Padding invariance
# ---------------------------------------------------------------------------------------------


@settings(max_examples=60, **PROPERTY)
@given(configs(masks=["padding"]), st.data())
def test_padded_positions_do_not_change_real_outputs(c, data):
    """With ``padding_mask(valid_lens)``, replacing every padded key/value (positions >=
    valid_lens[b]) by anything else, even huge, changes no output, on both paths.

    Fails when: ``padding_mask`` compares with ``<=`` instead of ``<`` (the first pad is
    visible); or the fused path drops ``attn_mask``.
    """
    gen = torch.Generator().manual_seed(c["seed"])
    B, Lq, Lk, d_model, dtype = c["B"], c["Lq"], c["Lk"], c["H"] * c["D"], c["dtype"]
    lens = torch.tensor(data.draw(st.lists(st.integers(0, Lk), min_size=B, max_size=B),
                                  label="valid_lens"))
    m = _module(c)
    q, kv = _randn(gen, B, Lq, d_model, dtype=dtype), _randn(gen, B, Lk, d_model, dtype=dtype)
    padded = torch.arange(Lk)[None, :] >= lens[:, None]  # (B, Lk)
    kv_new_pads = torch.where(padded[..., None], _randn(gen, B, Lk, d_model, dtype=dtype,
                                                        scale=100.0), kv)
    mask = padding_mask(lens, max_len=Lk)  # (B, 1, 1, Lk)
    for need_weights in (True, False):
        a, _ = _with_weights(m, q, kv, kv, mask=mask, need_weights=need_weights)
        b, _ = _with_weights(m, q, kv_new_pads, kv_new_pads, mask=mask, need_weights=need_weights)
        assert torch.isfinite(a).all()
        assert_close(b, a, **SAME[dtype])


# ---------------------------------------------------------------------------------------------
# 4. Without positions, self-attention does not know the order of its tokens
# ---------------------------------------------------------------------------------------------


@settings(max_examples=60, **PROPERTY)
@given(configs(masks=["none", "bool2d"]), st.data())
def test_self_attention_is_permutation_equivariant(c, data):
    """Self-attention with no positional encoding: permuting the tokens (and the rows and
    columns of the mask with them) permutes the output rows and the weights the same way.

    Fails when: ``split_heads`` is a bare ``x.reshape(B, H, L, D)`` without the transpose
    (the "view alone" mistake of chapter 5: each "head" then mixes features of different
    tokens), which also needs H > 1 and L > 1 to show.
    """
    gen = torch.Generator().manual_seed(c["seed"])
    B, L, d_model, dtype = c["B"], c["Lq"], c["H"] * c["D"], c["dtype"]
    perm = torch.tensor(data.draw(st.permutations(range(L)), label="perm"))
    m = _module(c)
    x = _randn(gen, B, L, d_model, dtype=dtype)
    mask = _mask(c, gen, L, L)
    mask_perm = None if mask is None else mask[perm][:, perm]
    for need_weights in (True, False):
        out, w = _with_weights(m, x, mask=mask, need_weights=need_weights)
        out_p, w_p = _with_weights(m, x[:, perm], mask=mask_perm, need_weights=need_weights)
        assert_close(out_p, out[:, perm], **AGREE[dtype])
        if need_weights:
            assert_close(w_p, w[:, :, perm][:, :, :, perm], **AGREE[dtype])


# ---------------------------------------------------------------------------------------------
# 5. The two forward paths agree, and agree with PyTorch
# ---------------------------------------------------------------------------------------------


@settings(max_examples=100, **PROPERTY)
@given(configs(), st.booleans())
def test_fused_and_explicit_paths_agree(c, self_attention):
    """``need_weights=False`` (PyTorch's fused kernel) and ``need_weights=True`` (the explicit
    path the book derives) give the same output for every mask kind and density, fully
    masked rows included, in every dtype; both are finite.

    Fails when: the fused path forgets to zero the rows with nothing to attend to (they come
    out as the mean of the values, or NaN); or the explicit scale is ``sqrt(D + 1)`` (any
    scale that is not ``1/sqrt(D)``).
    """
    gen = torch.Generator().manual_seed(c["seed"])
    B, Lq, Lk, d_model, dtype = c["B"], c["Lq"], c["Lk"], c["H"] * c["D"], c["dtype"]
    if self_attention:
        Lk = Lq
    m = _module(c)
    q = _randn(gen, B, Lq, d_model, dtype=dtype, scale=2.0)
    kv = q if self_attention else _randn(gen, B, Lk, d_model, dtype=dtype, scale=2.0)
    mask = _mask(c, gen, Lq, Lk)
    explicit, _ = _with_weights(m, q, kv, kv, mask=mask)
    fused, none = _with_weights(m, q, kv, kv, mask=mask, need_weights=False)
    assert none is None
    assert torch.isfinite(explicit).all() and torch.isfinite(fused).all()
    assert_close(fused.double(), explicit.double(), **AGREE[dtype])


@settings(max_examples=40, **PROPERTY)
@given(configs(dtypes=[torch.float64, torch.float32], masks=["none", "bool", "padding"],
               ).filter(lambda c: c["keep"] > 0))
def test_agrees_with_torch_multihead_attention(c):
    """``MultiHeadAttention`` and ``nn.MultiheadAttention`` with the same weights
    (``to_torch_mha``) give the same output and head-averaged weights; PyTorch's bool mask
    means the opposite (True = blocked), so it gets ``~mask``. Rows with nothing visible
    are left out: there PyTorch gives NaN and the library gives zeros by design.

    Fails when: the explicit scale is not ``1/sqrt(D)``; or ``merge_heads`` forgets its
    transpose (features of different tokens are concatenated).
    """
    gen = torch.Generator().manual_seed(c["seed"])
    B, H, Lq, Lk, d_model, dtype = c["B"], c["H"], c["Lq"], c["Lk"], c["H"] * c["D"], c["dtype"]
    m = _module(c)
    t = to_torch_mha(m)
    q, kv = _randn(gen, B, Lq, d_model, dtype=dtype), _randn(gen, B, Lk, d_model, dtype=dtype)
    mask = _mask(c, gen, Lq, Lk)
    live = _allowed(mask, (B, H, Lq, Lk)).any(-1).all(1)  # (B, Lq)
    torch_mask = None if mask is None else ~mask.expand(B, H, Lq, Lk).reshape(B * H, Lq, Lk)
    out, w = _with_weights(m, q, kv, kv, mask=mask)
    with torch.no_grad():
        expected, expected_w = t(q, kv, kv, attn_mask=torch_mask)
    assert_close(out[live], expected[live], **AGREE[dtype])
    assert_close(w.mean(1)[live], expected_w[live], **AGREE[dtype])


# ---------------------------------------------------------------------------------------------
# 6. The head reshapes undo each other, and put the right features in each head
# ---------------------------------------------------------------------------------------------


@settings(max_examples=60, **PROPERTY)
@given(B=st.integers(0, 3), L=st.integers(1, 5), H=st.integers(1, 4), D=st.integers(1, 4),
       dtype=st.sampled_from([*DTYPES, torch.int64]), seed=st.integers(0, 2**16))
def test_head_reshapes_are_inverses(B, L, H, D, dtype, seed):
    """``merge_heads(split_heads(x)) == x`` and ``transpose_output(transpose_qkv(x)) == x``
    bit for bit (any dtype, integers included, since they only move numbers); the other way
    round too; and head h of token l holds features ``h*D .. h*D + D - 1`` of token l, so
    ``transpose_qkv(x)`` is ``split_heads(x)`` with heads folded into the batch. The empty
    batch (B = 0) round-trips through split/merge; d2l's ``transpose_output`` refuses it.

    Fails when: ``merge_heads`` drops its transpose (round trip breaks); or both
    ``split_heads`` and ``merge_heads`` drop it (round trip holds, but head h no longer holds
    features h*D.. of one token: the content check catches that); or ``transpose_output``
    permutes ``(0, 1, 2, 3)`` instead of ``(0, 2, 1, 3)``.
    """
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(B, L, H * D, generator=gen) * 100).to(dtype)
    s = split_heads(x, H)  # (B, H, L, D)
    assert s.shape == (B, H, L, D)
    assert torch.equal(merge_heads(s), x)
    y = (torch.randn(B, H, L, D, generator=gen) * 100).to(dtype)
    assert torch.equal(split_heads(merge_heads(y), H), y)
    for h in range(H):
        assert torch.equal(s[:, h], x[..., h * D : (h + 1) * D])
    if B == 0:
        return
    folded = transpose_qkv(x, H)  # (B*H, L, D)
    assert torch.equal(folded, s.reshape(B * H, L, D))
    assert torch.equal(transpose_output(folded, H), x)
    z = (torch.randn(B * H, L, D, generator=gen) * 100).to(dtype)
    assert torch.equal(transpose_qkv(transpose_output(z, H), H), z)
