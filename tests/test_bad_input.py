"""Bad input fails early with a ValueError that names the argument and shows what was expected
and what was given (shapes as tuples/lists or values)."""

import re

import pytest
import torch

from mha_lib import (
    D2LMultiHeadAttention,
    DotProductAttention,
    EinsumMultiHeadAttention,
    MultiHeadAttention,
    MultiHeadLatentAttention,
    PositionalEncoding,
    TransformerBlock,
    build_vocab,
    encode,
    padding_mask,
    split_heads,
    transpose_qkv,
)

param = pytest.mark.parametrize


def _dims(*dims):
    """Regex for a shape such as (3, 4), [3, 4], torch.Size([3, 4]) or (Lq=3, Lk=4)."""
    return r",\s*(?:\w+=)?".join(str(d) for d in dims)


def _mentions(excinfo, *patterns):
    msg = str(excinfo.value)
    for pattern in patterns:
        assert re.search(pattern, msg), f"{pattern!r} not in message {msg!r}"


# ---------------------------------------------------------------------------------------------
# Construction
# ---------------------------------------------------------------------------------------------


def test_d_model_not_divisible_by_num_heads():
    torch.manual_seed(0)
    with pytest.raises(ValueError, match=r"d_model|num_heads") as excinfo:
        MultiHeadAttention(10, 3)
    _mentions(excinfo, r"\b10\b", r"\b3\b", r"d_model", r"num_heads")


@param("num_heads", [0, -2])
def test_num_heads_not_positive(num_heads):
    torch.manual_seed(0)
    with pytest.raises(ValueError, match=r"num_heads") as excinfo:
        MultiHeadAttention(8, num_heads)
    _mentions(excinfo, rf"{num_heads}\b")


# ---------------------------------------------------------------------------------------------
# MultiHeadAttention.forward: both paths validate the same way
# ---------------------------------------------------------------------------------------------

PATHS = param("need_weights", [True, False])


@PATHS
def test_query_wrong_rank(need_weights):
    torch.manual_seed(0)
    m = MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match=r"query") as excinfo:
        m(torch.randn(5, 8), need_weights=need_weights)
    # given: the 2-D shape (or its rank); expected: 3 dims (batch, length, d_model)
    _mentions(excinfo, _dims(5, 8) + r"|\b2\b", r"\b3\b|batch|\(B\b")


@PATHS
def test_query_wrong_feature_size(need_weights):
    torch.manual_seed(0)
    m = MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match=r"query") as excinfo:
        m(torch.randn(2, 5, 7), need_weights=need_weights)
    _mentions(excinfo, r"\b8\b", r"\b7\b")


@PATHS
def test_key_wrong_feature_size(need_weights):
    torch.manual_seed(0)
    m = MultiHeadAttention(8, 2)
    q, k = torch.randn(2, 5, 8), torch.randn(2, 5, 6)
    with pytest.raises(ValueError, match=r"key") as excinfo:
        m(q, k, torch.randn(2, 5, 8), need_weights=need_weights)
    _mentions(excinfo, r"\b8\b", r"\b6\b")


@PATHS
def test_key_value_length_mismatch(need_weights):
    torch.manual_seed(0)
    m = MultiHeadAttention(8, 2)
    q, k, v = torch.randn(2, 4, 8), torch.randn(2, 5, 8), torch.randn(2, 6, 8)
    with pytest.raises(ValueError, match=r"key|value") as excinfo:
        m(q, k, v, need_weights=need_weights)
    _mentions(excinfo, r"\b5\b", r"\b6\b")


@PATHS
@param(
    "mask_shape",
    [
        (3, 4),  # neither (Lq, Lk)
        (2, 1, 1, 4),  # key length 4 instead of 6
        (3, 1, 1, 6),  # batch 3 instead of 2
        (2, 5, 5, 6),  # 5 heads instead of 2
    ],
)
def test_mask_does_not_broadcast(need_weights, mask_shape):
    torch.manual_seed(0)
    m = MultiHeadAttention(8, 2)
    q, kv = torch.randn(2, 5, 8), torch.randn(2, 6, 8)
    mask = torch.ones(mask_shape, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"mask") as excinfo:
        m(q, kv, kv, mask=mask, need_weights=need_weights)
    # given shape, and the expected (B, H, Lq, Lk) = (2, 2, 5, 6)
    _mentions(excinfo, _dims(*mask_shape), _dims(5, 6))


# ---------------------------------------------------------------------------------------------
# PositionalEncoding
# ---------------------------------------------------------------------------------------------


def test_positional_encoding_too_long():
    torch.manual_seed(0)
    pe = PositionalEncoding(8, max_len=10)
    pe(torch.randn(1, 10, 8))  # exactly max_len is fine
    with pytest.raises(ValueError, match=r"max_len") as excinfo:
        pe(torch.randn(1, 12, 8))
    _mentions(excinfo, r"\b10\b", r"\b12\b")


def test_positional_encoding_wrong_d_model():
    torch.manual_seed(0)
    pe = PositionalEncoding(8, max_len=10)
    with pytest.raises(ValueError, match=r"\bx\b|d_model") as excinfo:  # forward(x)
        pe(torch.randn(1, 5, 6))
    _mentions(excinfo, r"\b8\b", r"\b6\b")


# ---------------------------------------------------------------------------------------------
# d2l-style valid_lens
# ---------------------------------------------------------------------------------------------

BAD_VALID_LENS = [
    ((7,), r"\b7\b"),  # batch 7 instead of 2
    ((2, 9), _dims(2, 9)),  # 9 queries instead of 4
    ((2, 4, 1), _dims(2, 4, 1)),  # 3-D
]


@param("shape,given", BAD_VALID_LENS)
def test_dot_product_attention_bad_valid_lens(shape, given):
    torch.manual_seed(0)
    att = DotProductAttention(0.0)
    q, k, v = torch.randn(2, 4, 6), torch.randn(2, 5, 6), torch.randn(2, 5, 3)
    with pytest.raises(ValueError, match=r"valid_lens") as excinfo:
        att(q, k, v, torch.ones(shape, dtype=torch.long))
    _mentions(excinfo, given, r"\b2\b")


@param("shape,given", BAD_VALID_LENS)
def test_d2l_multihead_bad_valid_lens(shape, given):
    torch.manual_seed(0)
    att = D2LMultiHeadAttention(5, 3, 7, 8, 2, 0.0)
    q, k, v = torch.randn(2, 4, 3), torch.randn(2, 5, 5), torch.randn(2, 5, 7)
    with pytest.raises(ValueError, match=r"valid_lens") as excinfo:
        att(q, k, v, torch.ones(shape, dtype=torch.long))
    _mentions(excinfo, given, r"\b2\b")


# ---------------------------------------------------------------------------------------------
# Head reshapes
# ---------------------------------------------------------------------------------------------


@param("fn", [split_heads, transpose_qkv])
def test_indivisible_heads(fn):
    torch.manual_seed(0)
    with pytest.raises(ValueError, match=r"num_heads") as excinfo:
        fn(torch.randn(2, 5, 10), 3)
    _mentions(excinfo, r"\b10\b", r"\b3\b")


# ---------------------------------------------------------------------------------------------
# Text
# ---------------------------------------------------------------------------------------------


def test_encode_unknown_token():
    torch.manual_seed(0)
    stoi = build_vocab(["hello world"])
    with pytest.raises(ValueError, match=r"zzz") as excinfo:
        encode(["hello zzz"], stoi)
    _mentions(excinfo, r"stoi|vocab|token")


def test_encode_ragged_without_pad_id():
    torch.manual_seed(0)
    stoi = build_vocab(["a b c", "a"])
    with pytest.raises(ValueError, match=r"pad_id") as excinfo:
        encode(["a b c", "a"], stoi)
    _mentions(excinfo, r"\b3\b|\b1\b")  # the lengths that differ


@param("need_weights", [True, False])
def test_float_keep_drop_mask_is_refused(need_weights):
    """Seeds 001/002 pass 1/0 float masks meaning keep/drop; added to the scores such a
    mask would block nothing, silently. The library says so and names the fix."""
    mha = MultiHeadAttention(8, 2)
    x = torch.randn(1, 5, 8)
    with pytest.raises(ValueError) as excinfo:
        mha(x, mask=torch.tril(torch.ones(5, 5)), need_weights=need_weights)
    _mentions(excinfo, r"^mask:", r"bool", r"0s and 1s", r"mask\.bool\(\)")
    # a genuine additive mask of 0 and -inf is accepted, and equals the bool form
    additive = torch.zeros(5, 5).masked_fill(~torch.ones(5, 5).tril().bool(), float("-inf"))
    out_float, _ = mha(x, mask=additive, need_weights=need_weights)
    out_bool, _ = mha(x, mask=torch.ones(5, 5).tril().bool(), need_weights=need_weights)
    torch.testing.assert_close(out_float, out_bool)


# ---------------------------------------------------------------------------------------------
# Unclear crashes made clear; values no check used to see
# ---------------------------------------------------------------------------------------------


@param("lengths", [[2.0, float("nan")], [2.5, 1.0], [float("inf"), 1.0], [[1.0, 0.5]]])
def test_padding_mask_refuses_lengths_that_are_not_whole(lengths):
    with pytest.raises(ValueError, match=r"valid_lens: expected whole numbers of keys, got a "
                                         r"length of (nan|2\.5|inf|0\.5)"):
        padding_mask(torch.tensor(lengths))
    assert torch.equal(padding_mask(torch.tensor([2.0, 1.0])),
                       padding_mask(torch.tensor([2, 1])))  # whole floats are lengths


def _modules_and_inputs():
    """Each module with a float32 input of the right shape and the input's name."""
    x = torch.randn(2, 5, 8)
    return [
        ("query", lambda m, t: m(t), MultiHeadAttention(8, 2)),
        ("x", lambda m, t: m(t), MultiHeadLatentAttention(8, 2, 4, 2)),
        ("x", lambda m, t: m(t), TransformerBlock(8, 2, 16)),
        ("queries", lambda m, t: m(t, t, t, None), D2LMultiHeadAttention(8, 8, 8, 8, 2, 0.0)),
        ("q", lambda m, t: m(t, t, t), EinsumMultiHeadAttention(2, 8, 4, 4)),
    ], x


def test_an_input_in_another_dtype_than_the_module_is_named():
    """A float64 input to a float32 module (or the other way round): the message names the
    argument, not an internal matrix product."""
    cases, x = _modules_and_inputs()
    for name, call, m in cases:
        for module_dtype, input_dtype in ((torch.float32, torch.float64),
                                          (torch.float64, torch.float32)):
            m.to(module_dtype)
            with pytest.raises(TypeError) as excinfo:
                call(m, x.to(input_dtype))
            _mentions(excinfo, rf"^{name}: expected dtype {module_dtype}", r"parameters",
                      str(input_dtype))
        call(m.double(), x.double())  # the same dtype is fine


@param("shape", [(2, 5), (2, 1)])
@param("need_weights", [True, False])
def test_a_row_of_keys_per_sequence_is_pointed_to_padding_mask(shape, need_weights):
    """(B, Lk) with B != Lq: not an (Lq, Lk) mask; the message says what to pass instead."""
    m = MultiHeadAttention(8, 2)
    x = torch.randn(2, 4, 8) if shape == (2, 1) else torch.randn(2, 3, 8)
    key = torch.randn(2, shape[1], 8)
    with pytest.raises(ValueError) as excinfo:
        m(x, key, key, mask=torch.ones(shape, dtype=torch.bool), need_weights=need_weights)
    _mentions(excinfo, r"^mask: expected a 2-D mask of shape \(Lq, Lk\)", r"\(B, Lk\)",
              r"mask\[:, None, None, :\]", r"padding_mask")


def test_a_row_of_keys_per_sequence_with_b_equal_to_lq_is_read_as_lq_lk():
    """Documented, since no check can tell: with B == Lq a (B, Lk) mask is an (Lq, Lk) one."""
    m = MultiHeadAttention(8, 2).eval()
    x = torch.randn(3, 3, 8)
    rows = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    assert torch.equal(m(x, mask=rows)[0], m(x, mask=rows[None, None])[0])
    assert not torch.equal(m(x, mask=rows)[0], m(x, mask=rows[:, None, None])[0])
    doc = " ".join(MultiHeadAttention.forward.__doc__.split())
    assert "read as ``(Lq, Lk)`` when ``B == Lq``" in doc


def test_forward_mode_ad_on_the_fused_path_says_use_need_weights_true():
    m = MultiHeadAttention(8, 2)
    x, tangent = torch.randn(2, 4, 8), torch.randn(2, 4, 8)
    with pytest.raises(NotImplementedError, match=r"need_weights=False .* no forward-mode AD: "
                                                  r"use need_weights=True"):
        torch.func.jvp(lambda t: m(t, need_weights=False)[0], (x,), (tangent,))
    _, explicit = torch.func.jvp(lambda t: m(t)[0], (x,), (tangent,))
    eps = 1e-3  # the explicit path has it: a central difference agrees
    diff = (m(x + eps * tangent)[0] - m(x - eps * tangent)[0]) / (2 * eps)
    torch.testing.assert_close(explicit, diff, atol=1e-2, rtol=1e-2)


def test_double_backward_on_the_fused_path_says_use_need_weights_true():
    m = MultiHeadAttention(8, 2)
    x = torch.randn(2, 4, 8, requires_grad=True)
    out, _ = m(x, is_causal=True, need_weights=False)
    (grad,) = torch.autograd.grad(out.square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match=r"no double backward .*: use need_weights=True"):
        grad.square().sum().backward()
    # first-order training is untouched, and the explicit path has second derivatives
    m(x, need_weights=False)[0].sum().backward()
    out, _ = m(x, is_causal=True)
    (grad,) = torch.autograd.grad(out.square().sum(), x, create_graph=True)
    grad.square().sum().backward()
    assert torch.isfinite(x.grad).all()
