"""A catalogue of bad input, end to end, for every public name in ``mha_lib.__all__``.

Each case is one wrong call: a wrong rank, a wrong size, a wrong dtype (integer tensors,
float64 with float32, a float64 mask for float32 queries), a mask that does not broadcast,
zero or negative heads and sizes, a non-tensor. Each must raise ``ValueError`` or
``TypeError`` (the type is part of the case) from inside ``mha_lib`` (never from deep inside
PyTorch), with a message of the library's one form::

    <argument>: expected <what was expected>, got <what was given>

The test checks all three parts.

Empty sequences are not bad input; what they give is defined (and tested) at the end:

* no keys (``Lk = 0``) for a non-empty query: every query row is fully masked, so the
  attention output is zeros, as for any row with nothing to attend to;
* no queries (``Lq = 0``) or no samples (``B = 0``): an empty output of the right shape;
* except in the d2l variant: d2l's ``transpose_output`` (as published, and as chapter 9
  teaches it) infers the batch with ``reshape(-1, ...)``, impossible for an empty tensor, so
  ``transpose_output`` and ``D2LMultiHeadAttention`` refuse empty queries with a ValueError.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from torch import nn

import mha_lib
from mha_lib import (
    D2LMultiHeadAttention,
    DotProductAttention,
    EinsumMultiHeadAttention,
    GroupedQueryAttention,
    KVCache,
    MultiHeadAttention,
    MultiHeadLatentAttention,
    PositionalEncoding,
    RotaryAttention,
    TinyTransformer,
    TransformerBlock,
    alibi_bias,
    apply_rotary,
    build_vocab,
    causal_mask,
    encode,
    from_torch_encoder_layer,
    from_torch_mha,
    masked_softmax,
    merge_heads,
    padding_mask,
    scaled_dot_product_attention,
    sinusoidal_encoding,
    sliding_window_mask,
    split_heads,
    to_torch_encoder_layer,
    to_torch_mha,
    tokenize,
    transpose_output,
    transpose_qkv,
)

LIBRARY = Path(mha_lib.__file__).resolve().parent


class Bad(NamedTuple):
    id: str
    call: object  # a function of no arguments that makes the bad call
    error: type  # ValueError or TypeError
    arg: str  # the argument the message must start with
    expected: str  # regex, searched in what the message says was expected
    given: str  # regex, searched in what the message says was given


def f32(*shape):
    return torch.ones(*shape)


def f64(*shape):
    return torch.ones(*shape, dtype=torch.float64)


def i64(*shape):
    return torch.ones(*shape, dtype=torch.long)


def keep(*shape):
    return torch.ones(shape, dtype=torch.bool)


def shape(*dims):
    """Regex for a shape as the messages print it: (2, 3, 4); (5,) or (5)."""
    return re.escape(str(tuple(dims))).replace(r",\)", r",?\)")


STOI = {"a": 0, "b": 1}
CASES: list[Bad] = []


def bad(*args) -> None:
    CASES.append(Bad(*args))


# --- text -------------------------------------------------------------------------------------
bad("tokenize/int", lambda: tokenize(3), TypeError, "text", "str", r"\bint\b")
bad("tokenize/list", lambda: tokenize(["a b"]), TypeError, "text", "str", r"\blist\b")
bad("tokenize/bytes", lambda: tokenize(b"a b"), TypeError, "text", "str", r"\bbytes\b")
bad("build_vocab/one-str", lambda: build_vocab("a b"), TypeError, "texts", "list of str",
    r"a str \('a b'\)")
bad("build_vocab/int", lambda: build_vocab(3), TypeError, "texts", "list of str", r"\bint\b")
bad("build_vocab/int-item", lambda: build_vocab(["a", 3]), TypeError, "texts", "str",
    r"int 3 at index 1")
bad("build_vocab/specials-str", lambda: build_vocab(["a"], specials="<pad>"), TypeError,
    "specials", "list of str", r"'<pad>'")
bad("encode/int", lambda: encode(3, STOI), TypeError, "texts", "list of str", r"\bint\b")
bad("encode/None-item", lambda: encode(["a", None], STOI), TypeError, "texts", "str",
    r"NoneType None at index 1")
bad("encode/stoi-list", lambda: encode(["a"], ["a"]), TypeError, "stoi", "mapping", r"\blist\b")
bad("encode/stoi-str-ids", lambda: encode(["a"], {"a": "0"}), TypeError, "stoi", "int ids",
    r"'0'")
bad("encode/pad_id-str", lambda: encode(["a", "a b"], STOI, pad_id="0"), TypeError, "pad_id",
    "int", r"'0'")
bad("encode/unknown-token", lambda: encode(["a zzz"], STOI), ValueError, "texts", "in stoi",
    r"'zzz'")
bad("encode/ragged-no-pad", lambda: encode(["a", "a b"], STOI), ValueError, "pad_id",
    r"\[1, 2\]", r"None")

# --- positions ----------------------------------------------------------------------------------
bad("sinusoidal/length-0", lambda: sinusoidal_encoding(0, 8), ValueError, "length",
    "positive int", r"\b0\b")
bad("sinusoidal/length-float", lambda: sinusoidal_encoding(4.0, 8), ValueError, "length",
    "positive int", r"4\.0")
bad("sinusoidal/odd-d_model", lambda: sinusoidal_encoding(4, 7), ValueError, "d_model", "even",
    r"\b7\b")
bad("PositionalEncoding/odd-d_model", lambda: PositionalEncoding(7), ValueError, "d_model",
    "even", r"\b7\b")
bad("PositionalEncoding/max_len-0", lambda: PositionalEncoding(8, max_len=0), ValueError,
    "max_len", "positive int", r"\b0\b")
bad("PositionalEncoding/dropout-1.5", lambda: PositionalEncoding(8, dropout=1.5), ValueError,
    "dropout", r"\[0, 1\]", r"1\.5")
bad("PositionalEncoding/dropout-str", lambda: PositionalEncoding(8, dropout="0.1"), ValueError,
    "dropout", "probability", r"'0\.1'")
bad("PositionalEncoding/x-2d", lambda: PositionalEncoding(8)(f32(5, 8)), ValueError, "x",
    r"3-D", shape(5, 8))
bad("PositionalEncoding/x-width", lambda: PositionalEncoding(8)(f32(1, 5, 6)), ValueError, "x",
    r"\b8\b", shape(1, 5, 6))
bad("PositionalEncoding/x-int", lambda: PositionalEncoding(8)(i64(1, 5, 8)), TypeError, "x",
    "floating", r"int64")
bad("PositionalEncoding/too-long", lambda: PositionalEncoding(8, max_len=4)(f32(1, 5, 8)),
    ValueError, "x", r"max_len=4", r"length 5")

# --- masks --------------------------------------------------------------------------------------
bad("causal_mask/negative", lambda: causal_mask(-1), ValueError, "q_len", "non-negative int",
    r"-1")
bad("causal_mask/float", lambda: causal_mask(3, 2.5), ValueError, "k_len", "int", r"2\.5")
bad("causal_mask/tensor", lambda: causal_mask(torch.tensor(3)), ValueError, "q_len", "int",
    r"tensor\(3\)")
bad("causal_mask/bool", lambda: causal_mask(True), ValueError, "q_len", "int", r"True")
bad("padding_mask/list", lambda: padding_mask([1, 2]), TypeError, "valid_lens", "tensor",
    r"\blist\b")
bad("padding_mask/0-d", lambda: padding_mask(torch.tensor(3)), ValueError, "valid_lens",
    r"\(B,\)", r"\(\)")
bad("padding_mask/3-d", lambda: padding_mask(i64(2, 2, 2)), ValueError, "valid_lens",
    r"\(B, Lq\)", shape(2, 2, 2))
bad("padding_mask/bool", lambda: padding_mask(keep(2)), TypeError, "valid_lens", "integer",
    r"torch\.bool")
bad("padding_mask/negative", lambda: padding_mask(torch.tensor([-1, 2])), ValueError,
    "valid_lens", r">= 0", r"-1")
bad("padding_mask/longer-than-max_len", lambda: padding_mask(torch.tensor([5, 2]), max_len=3),
    ValueError, "valid_lens", r"max_len=3", r"\b5\b")
bad("padding_mask/max_len-negative", lambda: padding_mask(torch.tensor([1]), max_len=-1),
    ValueError, "max_len", "non-negative int", r"-1")
bad("padding_mask/max_len-float", lambda: padding_mask(torch.tensor([1]), max_len=2.0),
    ValueError, "max_len", "int", r"2\.0")

# --- head reshapes ------------------------------------------------------------------------------
bad("split_heads/2d", lambda: split_heads(f32(3, 4), 2), ValueError, "x", r"3-D", shape(3, 4))
bad("split_heads/list", lambda: split_heads([[1.0]], 2), TypeError, "x", "Tensor", r"\blist\b")
bad("split_heads/zero-heads", lambda: split_heads(f32(2, 3, 4), 0), ValueError, "num_heads",
    "positive int", r"\b0\b")
bad("split_heads/float-heads", lambda: split_heads(f32(2, 3, 4), 2.0), ValueError, "num_heads",
    "positive int", r"2\.0")
bad("split_heads/indivisible", lambda: split_heads(f32(2, 3, 10), 3), ValueError, "x",
    r"num_heads=3", shape(2, 3, 10))
bad("merge_heads/3d", lambda: merge_heads(f32(2, 3, 4)), ValueError, "x", r"4-D", shape(2, 3, 4))
bad("merge_heads/5d", lambda: merge_heads(f32(1, 2, 3, 4, 5)), ValueError, "x", r"4-D",
    shape(1, 2, 3, 4, 5))
bad("transpose_qkv/2d", lambda: transpose_qkv(f32(3, 4), 2), ValueError, "X", r"3-D",
    shape(3, 4))
bad("transpose_qkv/indivisible", lambda: transpose_qkv(f32(2, 3, 10), 4), ValueError, "X",
    r"num_heads=4", shape(2, 3, 10))
bad("transpose_qkv/zero-heads", lambda: transpose_qkv(f32(2, 3, 4), 0), ValueError,
    "num_heads", "positive int", r"\b0\b")
bad("transpose_output/2d", lambda: transpose_output(f32(3, 4), 2), ValueError, "X", r"3-D",
    shape(3, 4))
bad("transpose_output/indivisible", lambda: transpose_output(f32(3, 4, 5), 2), ValueError, "X",
    r"num_heads=2", shape(3, 4, 5))
bad("transpose_output/negative-heads", lambda: transpose_output(f32(4, 3, 5), -1), ValueError,
    "num_heads", "positive int", r"-1")
bad("transpose_output/empty", lambda: transpose_output(f32(4, 0, 5), 2), ValueError, "X",
    "non-empty", shape(4, 0, 5))

# --- scaled_dot_product_attention and masked_softmax --------------------------------------------
Q, K, V = (2, 3, 4), (2, 5, 4), (2, 5, 6)


def sdpa(q=None, k=None, v=None, **kwargs):
    q = f32(*Q) if q is None else q
    k = f32(*K) if k is None else k
    v = f32(*V) if v is None else v
    return lambda: scaled_dot_product_attention(q, k, v, **kwargs)


bad("sdpa/query-1d", sdpa(q=f32(4)), ValueError, "query", "2 dims", shape(4))
bad("sdpa/query-list", sdpa(q=[[1.0]]), TypeError, "query", "Tensor", r"\blist\b")
bad("sdpa/int", sdpa(i64(*Q), i64(*K), i64(*V)), TypeError, "query", "floating", r"int64")
bad("sdpa/key-float64", sdpa(k=f64(*K)), TypeError, "key", r"float32", r"float64")
bad("sdpa/value-float64", sdpa(v=f64(*V)), TypeError, "value", r"float32", r"float64")
bad("sdpa/key-width", sdpa(k=f32(2, 5, 6)), ValueError, "key", r"D=4", shape(2, 5, 6))
bad("sdpa/value-length", sdpa(v=f32(2, 6, 3)), ValueError, "value", r"Lk=5", shape(2, 6, 3))
bad("sdpa/key-batch", sdpa(k=f32(3, 5, 4), v=f32(3, 5, 6)), ValueError, "key", r"\(2,\)",
    shape(3, 5, 4))
bad("sdpa/value-batch", sdpa(v=f32(3, 5, 6)), ValueError, "value", r"\(2,\)", shape(3, 5, 6))
bad("sdpa/zero-width", sdpa(f32(2, 3, 0), f32(2, 5, 0)), ValueError, "query", r"D >= 1",
    shape(2, 3, 0))
bad("sdpa/mask-shape", sdpa(mask=keep(4, 5)), ValueError, "mask", r"Lq=3, Lk=5", shape(4, 5))
bad("sdpa/mask-int", sdpa(mask=i64(3, 5)), TypeError, "mask", r"torch\.bool", r"int64")
bad("sdpa/mask-float64", sdpa(mask=torch.zeros(3, 5, dtype=torch.float64)), TypeError, "mask",
    r"float32", r"float64")
bad("sdpa/mask-0-1-float", sdpa(mask=f32(3, 5)), ValueError, "mask", r"bool mask",
    r"only 0s and 1s")
bad("sdpa/mask-list", sdpa(mask=[[True]]), TypeError, "mask", "tensor", r"\blist\b")
bad("sdpa/dropout-float", sdpa(dropout=0.1), TypeError, "dropout", "callable", r"0\.1")
bad("sdpa/scale-str", sdpa(scale="0.5"), TypeError, "scale", "float", r"'0\.5'")
bad("masked_softmax/list", lambda: masked_softmax([1.0, 2.0]), TypeError, "scores", "Tensor",
    r"\blist\b")
bad("masked_softmax/int", lambda: masked_softmax(i64(3, 4)), TypeError, "scores", "floating",
    r"int64")
bad("masked_softmax/0-d", lambda: masked_softmax(torch.tensor(1.0)), ValueError, "scores",
    "1 dim", r"0-D")
bad("masked_softmax/mask-shape", lambda: masked_softmax(f32(3, 4), keep(3, 5)), ValueError,
    "mask", r"Lq=3, Lk=4", shape(3, 5))
bad("masked_softmax/mask-1d-shape", lambda: masked_softmax(f32(4), keep(5)), ValueError, "mask",
    r"Lk=4", shape(5))
bad("masked_softmax/mask-float64", lambda: masked_softmax(f32(3, 4), f64(3, 4) * -1), TypeError,
    "mask", r"float32", r"float64")

# --- MultiHeadAttention -------------------------------------------------------------------------
bad("MHA/d_model-0", lambda: MultiHeadAttention(0, 2), ValueError, "d_model", "positive int",
    r"\b0\b")
bad("MHA/d_model-float", lambda: MultiHeadAttention(8.0, 2), ValueError, "d_model",
    "positive int", r"8\.0")
bad("MHA/zero-heads", lambda: MultiHeadAttention(8, 0), ValueError, "num_heads", "positive int",
    r"\b0\b")
bad("MHA/negative-heads", lambda: MultiHeadAttention(8, -2), ValueError, "num_heads",
    "positive int", r"-2")
bad("MHA/indivisible", lambda: MultiHeadAttention(10, 3), ValueError, "num_heads",
    r"d_model=10", r"num_heads=3")
bad("MHA/dropout-1", lambda: MultiHeadAttention(8, 2, dropout=1.0), ValueError, "dropout",
    r"\[0, 1\)", r"1\.0")
bad("MHA/dropout-negative", lambda: MultiHeadAttention(8, 2, dropout=-0.1), ValueError,
    "dropout", r"\[0, 1\)", r"-0\.1")
bad("MHA/dropout-str", lambda: MultiHeadAttention(8, 2, dropout="0.1"), ValueError, "dropout",
    r"\[0, 1\)", r"'0\.1'")


def mha(query, key=None, value=None, mask=None, *, need_weights, **kwargs):
    m = MultiHeadAttention(8, 2)
    return lambda: m(query, key, value, mask=mask, need_weights=need_weights, **kwargs)


# A query in another dtype than the layers' weights (float64 into float32 layers) is left to
# PyTorch's own error, which names both dtypes: the module's checks read its inputs, never its
# layers' parameters (a quantized or LoRA-wrapped layer has no single weight dtype to read).


X, KV = f32(2, 5, 8), f32(2, 6, 8)
for nw in (True, False):
    p = f"MHA[need_weights={nw}]"
    bad(f"{p}/query-2d", mha(f32(5, 8), need_weights=nw), ValueError, "query", r"3-D",
        shape(5, 8))
    bad(f"{p}/query-4d", mha(f32(1, 2, 5, 8), need_weights=nw), ValueError, "query", r"3-D",
        shape(1, 2, 5, 8))
    bad(f"{p}/query-list", mha([[1.0]], need_weights=nw), TypeError, "query", "Tensor",
        r"\blist\b")
    bad(f"{p}/query-int", mha(i64(2, 5, 8), need_weights=nw), TypeError, "query", "floating",
        r"int64")
    bad(f"{p}/query-width", mha(f32(2, 5, 7), need_weights=nw), ValueError, "query", r"\b8\b",
        shape(2, 5, 7))
    bad(f"{p}/key-width", mha(X, f32(2, 6, 6), KV, need_weights=nw), ValueError, "key",
        r"\b8\b", shape(2, 6, 6))
    bad(f"{p}/key-batch", mha(X, f32(3, 6, 8), f32(3, 6, 8), need_weights=nw), ValueError,
        "key", r"\(2, Lk, 8\)", shape(3, 6, 8))
    bad(f"{p}/value-length", mha(X, KV, f32(2, 7, 8), need_weights=nw), ValueError, "value",
        r"\b6\b", shape(2, 7, 8))
    bad(f"{p}/value-width", mha(X, KV, f32(2, 6, 4), need_weights=nw), ValueError, "value",
        r"\b8\b", shape(2, 6, 4))
    for mask_shape in [(3, 4), (2, 1, 1, 4), (3, 1, 1, 6), (2, 5, 5, 6)]:
        bad(f"{p}/mask{mask_shape}", mha(X, KV, KV, keep(*mask_shape), need_weights=nw),
            ValueError, "mask", r"B=2, H=2, Lq=5, Lk=6", shape(*mask_shape))
    # Only (Lq, Lk) and (B|1, H|1, Lq, Lk): a 3-D mask could be (B, ...) or (H, ...).
    for mask_shape in [(1, 2, 2, 5, 6), (6,), ()]:
        bad(f"{p}/mask{mask_shape}", mha(X, KV, KV, keep(*mask_shape), need_weights=nw),
            ValueError, "mask", r"\(Lq, Lk\) = \(5, 6\)", shape(*mask_shape))
    bad(f"{p}/mask-3d", mha(X, KV, KV, keep(2, 5, 6), need_weights=nw), ValueError,
        "mask", r"mask\[:, None\].*mask\[None\]", shape(2, 5, 6))
    bad(f"{p}/mask-device", mha(X, KV, KV, torch.ones(5, 6, dtype=torch.bool,
                                                       device="meta"), need_weights=nw),
        ValueError, "mask", r"cpu", r"meta")
    bad(f"{p}/key-device", mha(X, torch.ones(2, 6, 8, device="meta"), KV,
                               need_weights=nw), ValueError, "key", r"cpu", r"meta")
    bad(f"{p}/cache-of-two-layers", mha(X, cache=KVCache(2), need_weights=nw), ValueError,
        "cache", r"cache\.layer\(i\)", r"2 layers")
    bad(f"{p}/cached-chunk-without-mask", mha(X, cache=KVCache(1), need_weights=nw),
        ValueError, "mask", r"is_causal=True", r"5 new tokens")
    bad(f"{p}/is_causal-int", mha(X, is_causal=1, need_weights=nw), TypeError, "is_causal",
        "bool", r"\b1\b")
    bad(f"{p}/mask-int", mha(X, KV, KV, i64(5, 6), need_weights=nw), TypeError, "mask",
        r"torch\.bool", r"int64")
    bad(f"{p}/mask-float64", mha(X, KV, KV, torch.zeros(5, 6, dtype=torch.float64),
                                 need_weights=nw), TypeError, "mask", r"float32", r"float64")
    bad(f"{p}/mask-0-1-float", mha(X, KV, KV, f32(5, 6), need_weights=nw), ValueError, "mask",
        r"bool mask", r"only 0s and 1s")
    bad(f"{p}/mask-list", mha(X, KV, KV, [[True]], need_weights=nw), TypeError, "mask",
        "tensor", r"\blist\b")
    bad(f"{p}/key-float64", mha(X, f64(2, 6, 8), f64(2, 6, 8), need_weights=nw), TypeError,
        "key", r"float32", r"float64")
    bad(f"{p}/value-float16", mha(X, KV, KV.half(), need_weights=nw), TypeError, "value",
        r"float32", r"float16")

# --- the d2l variant ----------------------------------------------------------------------------
bad("DotProductAttention/dropout-negative", lambda: DotProductAttention(-0.5), ValueError,
    "dropout", r"\[0, 1\]", r"-0\.5")


def dpa(q=None, k=None, v=None, valid_lens=None):
    q = f32(*Q) if q is None else q
    k = f32(*K) if k is None else k
    v = f32(*V) if v is None else v
    return lambda: DotProductAttention(0.0)(q, k, v, valid_lens)


bad("DotProductAttention/queries-2d", dpa(q=f32(3, 4)), ValueError, "queries", r"3-D",
    shape(3, 4))
bad("DotProductAttention/int", dpa(i64(*Q), i64(*K), i64(*V)), TypeError, "queries",
    "floating", r"int64")
bad("DotProductAttention/keys-width", dpa(k=f32(2, 5, 3)), ValueError, "keys", r"\b4\b",
    shape(2, 5, 3))
bad("DotProductAttention/values-length", dpa(v=f32(2, 4, 6)), ValueError, "values", r"\b5\b",
    shape(2, 4, 6))
bad("DotProductAttention/keys-float64", dpa(k=f64(*K)), TypeError, "keys", r"float32",
    r"float64")
bad("DotProductAttention/valid_lens-batch", dpa(valid_lens=i64(7)), ValueError, "valid_lens",
    r"\(2,\) or \(2, 3\)", shape(7))
bad("DotProductAttention/valid_lens-list", dpa(valid_lens=[1, 2]), TypeError, "valid_lens",
    "tensor", r"\blist\b")
bad("DotProductAttention/valid_lens-bool", dpa(valid_lens=keep(2)), TypeError, "valid_lens",
    "integer", r"torch\.bool")
bad("DotProductAttention/valid_lens-negative", dpa(valid_lens=torch.tensor([-1, 2])),
    ValueError, "valid_lens", r">= 0", r"-1")
bad("DotProductAttention/valid_lens-too-long", dpa(valid_lens=torch.tensor([9, 2])), ValueError,
    "valid_lens", r"max_len=5", r"\b9\b")

bad("D2L/zero-heads", lambda: D2LMultiHeadAttention(4, 4, 4, 8, 0, 0.0), ValueError,
    "num_heads", "positive int", r"\b0\b")
bad("D2L/indivisible", lambda: D2LMultiHeadAttention(4, 4, 4, 10, 3, 0.0), ValueError,
    "num_heads", r"num_hiddens=10", r"num_heads=3")
bad("D2L/num_hiddens-0", lambda: D2LMultiHeadAttention(4, 4, 4, 0, 2, 0.0), ValueError,
    "num_hiddens", "positive int", r"\b0\b")
bad("D2L/key_size-negative", lambda: D2LMultiHeadAttention(-4, 4, 4, 8, 2, 0.0), ValueError,
    "key_size", "positive int", r"-4")
bad("D2L/dropout-2", lambda: D2LMultiHeadAttention(4, 4, 4, 8, 2, 2.0), ValueError, "dropout",
    r"\[0, 1\]", r"2\.0")


def d2l(q=None, k=None, v=None, valid_lens=None):
    q = f32(2, 3, 3) if q is None else q  # query_size 3
    k = f32(2, 5, 5) if k is None else k  # key_size 5
    v = f32(2, 5, 7) if v is None else v  # value_size 7
    return lambda: D2LMultiHeadAttention(5, 3, 7, 8, 2, 0.0)(q, k, v, valid_lens)


bad("D2L/queries-width", d2l(q=f32(2, 3, 4)), ValueError, "queries", r"\b3\b", shape(2, 3, 4))
bad("D2L/queries-2d", d2l(q=f32(3, 3)), ValueError, "queries", r"3-D", shape(3, 3))
bad("D2L/queries-int", d2l(q=i64(2, 3, 3)), TypeError, "queries", "floating", r"int64")
bad("D2L/queries-float64", d2l(q=f64(2, 3, 3)), TypeError, "queries", r"float32", r"float64")
bad("D2L/keys-width", d2l(k=f32(2, 5, 4)), ValueError, "keys", r"\b5\b", shape(2, 5, 4))
bad("D2L/values-length", d2l(v=f32(2, 4, 7)), ValueError, "values", r"\b5\b", shape(2, 4, 7))
bad("D2L/valid_lens-shape", d2l(valid_lens=i64(2, 9)), ValueError, "valid_lens",
    r"\(2, 3\)", shape(2, 9))
bad("D2L/valid_lens-too-long", d2l(valid_lens=torch.tensor([6, 2])), ValueError, "valid_lens",
    r"max_len=5", r"\b6\b")
bad("D2L/no-queries", d2l(q=f32(2, 0, 3)), ValueError, "queries", "at least one",
    shape(2, 0, 3))

# --- the einsum variant -------------------------------------------------------------------------
bad("Einsum/zero-heads", lambda: EinsumMultiHeadAttention(0, 8, 4, 4), ValueError, "n_head",
    "positive int", r"\b0\b")
bad("Einsum/d_k-0", lambda: EinsumMultiHeadAttention(2, 8, 0, 4), ValueError, "d_k",
    "positive int", r"\b0\b")
bad("Einsum/dropout-2", lambda: EinsumMultiHeadAttention(2, 8, 4, 4, dropout=2.0), ValueError,
    "dropout", r"\[0, 1\]", r"2\.0")


def einsum(q=None, k=None, v=None, mask=None):
    q = f32(2, 3, 8) if q is None else q
    k = f32(2, 4, 8) if k is None else k
    v = f32(2, 4, 8) if v is None else v
    return lambda: EinsumMultiHeadAttention(2, 8, 4, 3)(q, k, v, mask)


bad("Einsum/q-2d", einsum(q=f32(3, 8)), ValueError, "q", r"3-D", shape(3, 8))
bad("Einsum/q-width", einsum(q=f32(2, 3, 6)), ValueError, "q", r"\b8\b", shape(2, 3, 6))
bad("Einsum/q-int", einsum(q=i64(2, 3, 8)), TypeError, "q", "floating", r"int64")
bad("Einsum/q-float64", einsum(q=f64(2, 3, 8)), TypeError, "q", r"float32", r"float64")
bad("Einsum/k-float64", einsum(k=f64(2, 4, 8)), TypeError, "k", r"float32", r"float64")
bad("Einsum/k-batch", einsum(k=f32(3, 4, 8)), ValueError, "k", r"\b2\b", shape(3, 4, 8))
bad("Einsum/v-length", einsum(v=f32(2, 5, 8)), ValueError, "v", r"\b4\b", shape(2, 5, 8))
bad("Einsum/mask-shape", einsum(mask=keep(3, 3)), ValueError, "mask", r"B=2, Lq=3, Lk=4",
    shape(3, 3))
bad("Einsum/mask-4d-heads", einsum(mask=keep(2, 3, 3, 4)), ValueError, "mask",
    r"B=2, H=2, Lq=3, Lk=4", shape(2, 3, 3, 4))
bad("Einsum/mask-list", einsum(mask=[[True]]), TypeError, "mask", "tensor", r"\blist\b")
bad("Einsum/mask-int", einsum(mask=i64(3, 4)), TypeError, "mask", r"torch\.bool", r"int64")
bad("Einsum/mask-float64", einsum(mask=torch.zeros(3, 4, dtype=torch.float64)), TypeError,
    "mask", r"float32", r"float64")

# --- interop ------------------------------------------------------------------------------------
bad("to_torch_mha/linear", lambda: to_torch_mha(nn.Linear(8, 8)), TypeError, "m",
    "MultiHeadAttention", r"\bLinear\b")
bad("to_torch_mha/grouped", lambda: to_torch_mha(GroupedQueryAttention(8, 4, 2)), ValueError,
    "m", r"one key/value head per query head", r"num_kv_heads=2")
bad("from_torch_mha/ours", lambda: from_torch_mha(MultiHeadAttention(8, 2)), TypeError, "t",
    "nn.MultiheadAttention", r"\bMultiHeadAttention\b")
bad("from_torch_mha/kdim", lambda: from_torch_mha(nn.MultiheadAttention(8, 2, kdim=4, vdim=4)),
    ValueError, "t", r"embed_dim=8", r"kdim=4")
bad("from_torch_mha/bias_kv", lambda: from_torch_mha(nn.MultiheadAttention(8, 2,
                                                                           add_bias_kv=True)),
    ValueError, "t", r"add_bias_kv=False", r"uses them")

# --- chapter 14: grouped-query attention, the KV cache, the tiny transformer --------------------
bad("GroupedQueryAttention/zero-kv-heads", lambda: GroupedQueryAttention(8, 4, 0), ValueError,
    "num_kv_heads", "positive int", r"\b0\b")
bad("GroupedQueryAttention/indivisible", lambda: GroupedQueryAttention(8, 4, 3), ValueError,
    "num_kv_heads", r"num_heads=4", r"num_kv_heads=3")
bad("GroupedQueryAttention/query-2d", lambda: GroupedQueryAttention(8, 4, 2)(f32(5, 8)),
    ValueError, "query", r"3-D", shape(5, 8))
bad("GroupedQueryAttention/mask-shape",
    lambda: GroupedQueryAttention(8, 4, 2)(X, mask=keep(3, 3)), ValueError, "mask",
    r"B=2, H=4, Lq=5, Lk=5", shape(3, 3))
bad("GroupedQueryAttention/cache-int", lambda: GroupedQueryAttention(8, 4, 2)(X, cache=3),
    TypeError, "cache", "KVCache", r"\bint\b")
bad("KVCache/zero-layers", lambda: KVCache(0), ValueError, "num_layers", "positive int",
    r"\b0\b")
bad("KVCache/layer-out-of-range", lambda: KVCache(2).layer(5), ValueError, "index",
    r"\[0, 2\)", r"\b5\b")
bad("KVCache/key-3d", lambda: KVCache(1).update(f32(2, 3, 4), f32(2, 3, 4)), ValueError, "key",
    r"4-D", shape(2, 3, 4))


def _cache_then(key, value):
    cache = KVCache(1)
    cache.update(f32(2, 2, 3, 4), f32(2, 2, 3, 4))  # (B, H_kv, L, D) = (2, 2, 3, 4)
    return lambda: cache.update(key, value)


bad("KVCache/key-heads", _cache_then(f32(2, 3, 1, 4), f32(2, 3, 1, 4)), ValueError, "key",
    r"\(2, 2, N, 4\)", shape(2, 3, 1, 4))
bad("KVCache/key-float64", _cache_then(f64(2, 2, 1, 4), f64(2, 2, 1, 4)), ValueError, "key",
    r"float32", r"float64")
bad("KVCache/value-length", _cache_then(f32(2, 2, 1, 4), f32(2, 2, 2, 4)), ValueError, "value",
    r"\(2, 2, 1, Dv\)", shape(2, 2, 2, 4))


def tiny():
    return TinyTransformer(10, 8, 2, 1, max_len=6)


bad("TinyTransformer/zero-vocab", lambda: TinyTransformer(0, 8, 2, 1, 16), ValueError,
    "vocab_size", "positive int", r"\b0\b")
bad("TinyTransformer/float-ids", lambda: tiny()(f32(2, 3)), TypeError, "idx", "integer",
    r"float32")
bad("TinyTransformer/ids-1d", lambda: tiny()(i64(3)), ValueError, "idx", r"2-D", shape(3))
bad("TinyTransformer/too-long", lambda: tiny()(i64(1, 7)), ValueError, "idx", r"max_len=6",
    r"\b7\b")
bad("TinyTransformer/cache-layers", lambda: tiny()(i64(1, 2), cache=KVCache(3)), ValueError,
    "cache", r"num_layers=1", r"num_layers=3")
bad("TinyTransformer/generate-negative", lambda: tiny().generate(i64(1, 2), -1), ValueError,
    "max_new_tokens", "non-negative int", r"-1")
bad("TinyTransformer/id-beyond-vocab", lambda: tiny()(torch.full((1, 3), 12)), ValueError,
    "idx", r"vocab_size=10", r"\b12\b")
bad("TinyTransformer/negative-id", lambda: tiny()(torch.full((1, 3), -1)), ValueError,
    "idx", r"vocab_size=10", r"-1")


# --- chapters 16-18: rotary positions, sliding windows, ALiBi, latent attention --------------
POS5 = torch.arange(5)
bad("apply_rotary/odd-D", lambda: apply_rotary(f32(2, 5, 7), POS5), ValueError, "x",
    "D even", shape(2, 5, 7))
bad("apply_rotary/x-1d", lambda: apply_rotary(f32(8), POS5[:1]), ValueError, "x",
    "D even", shape(8))
bad("apply_rotary/x-int", lambda: apply_rotary(i64(5, 4), POS5), TypeError, "x",
    "floating", r"int64")
bad("apply_rotary/x-list", lambda: apply_rotary([[1.0, 2.0]], POS5), TypeError, "x",
    "Tensor", r"\blist\b")
bad("apply_rotary/float-positions", lambda: apply_rotary(f32(5, 4), POS5.float()),
    TypeError, "positions", "integer", r"float32")
bad("apply_rotary/positions-2d", lambda: apply_rotary(f32(5, 4), POS5[None]), ValueError,
    "positions", r"1-D", shape(1, 5))
bad("apply_rotary/positions-length", lambda: apply_rotary(f32(5, 4), POS5[:3]), ValueError,
    "positions", r"\(5,\)", shape(3))
bad("apply_rotary/base-1", lambda: apply_rotary(f32(5, 4), POS5, base=1.0), ValueError,
    "base", "> 1", r"1\.0")
bad("apply_rotary/interleaved-str", lambda: apply_rotary(f32(5, 4), POS5, interleaved="no"),
    TypeError, "interleaved", "bool", r"'no'")
bad("RotaryAttention/odd-head_dim", lambda: RotaryAttention(6, 2), ValueError, "num_heads",
    "even", r"head_dim=3")
bad("RotaryAttention/indivisible-kv", lambda: RotaryAttention(8, 4, 3), ValueError,
    "num_kv_heads", r"num_heads=4", r"num_kv_heads=3")
bad("RotaryAttention/base-0", lambda: RotaryAttention(8, 2, base=0), ValueError, "base",
    "> 1", r"\b0\b")
bad("RotaryAttention/query-2d", lambda: RotaryAttention(8, 2)(f32(5, 8)), ValueError,
    "query", r"3-D", shape(5, 8))
bad("RotaryAttention/mask-3d", lambda: RotaryAttention(8, 2)(X, mask=keep(2, 5, 5)),
    ValueError, "mask", r"B\|1, H\|1", shape(2, 5, 5))
bad("sliding_window_mask/window-0", lambda: sliding_window_mask(4, 0), ValueError, "window",
    "positive int", r"\b0\b")
bad("sliding_window_mask/window-float", lambda: sliding_window_mask(4, 2.0), ValueError,
    "window", "positive int", r"2\.0")
bad("sliding_window_mask/q_len-negative", lambda: sliding_window_mask(-1, 2), ValueError,
    "q_len", "non-negative int", r"-1")
bad("alibi_bias/zero-heads", lambda: alibi_bias(0, 4), ValueError, "num_heads",
    "positive int", r"\b0\b")
bad("alibi_bias/q_len-float", lambda: alibi_bias(4, 4.0), ValueError, "q_len",
    "non-negative int", r"4\.0")
bad("alibi_bias/k_len-negative", lambda: alibi_bias(4, 4, -2), ValueError, "k_len",
    "non-negative int", r"-2")
bad("MultiHeadLatentAttention/odd-rope", lambda: MultiHeadLatentAttention(8, 2, 4, 3),
    ValueError, "rope_dim", "even", r"\b3\b")
bad("MultiHeadLatentAttention/zero-latent", lambda: MultiHeadLatentAttention(8, 2, 0, 2),
    ValueError, "kv_latent_dim", "positive int", r"\b0\b")
bad("MultiHeadLatentAttention/indivisible", lambda: MultiHeadLatentAttention(8, 3, 4, 2),
    ValueError, "num_heads", r"d_model=8", r"num_heads=3")
bad("MultiHeadLatentAttention/dropout-1", lambda: MultiHeadLatentAttention(8, 2, 4, 2,
                                                                           dropout=1.0),
    ValueError, "dropout", r"\[0, 1\)", r"1\.0")


def mla(x=None, **kwargs):
    x = f32(2, 5, 8) if x is None else x
    return lambda: MultiHeadLatentAttention(8, 2, 4, 2)(x, **kwargs)


bad("MultiHeadLatentAttention/x-2d", mla(f32(5, 8)), ValueError, "x", r"3-D", shape(5, 8))
bad("MultiHeadLatentAttention/x-width", mla(f32(2, 5, 6)), ValueError, "x", r"\b8\b",
    shape(2, 5, 6))
bad("MultiHeadLatentAttention/x-int", mla(i64(2, 5, 8)), TypeError, "x", "floating",
    r"int64")
bad("MultiHeadLatentAttention/mask-3d", mla(mask=keep(2, 5, 5)), ValueError, "mask",
    r"B\|1, H\|1", shape(2, 5, 5))
bad("MultiHeadLatentAttention/mask-shape", mla(mask=keep(3, 3)), ValueError, "mask",
    r"B=2, H=2, Lq=5, Lk=5", shape(3, 3))
bad("MultiHeadLatentAttention/mask-float64", mla(mask=torch.zeros(5, 5, dtype=torch.float64)),
    TypeError, "mask", r"float32", r"float64")
bad("MultiHeadLatentAttention/cache-no-mask", mla(cache=KVCache()), ValueError, "mask",
    r"is_causal=True", r"neither")
bad("MultiHeadLatentAttention/cache-int", mla(cache=3), TypeError, "cache", "KVCache",
    r"\bint\b")
bad("MultiHeadLatentAttention/absorb-str", mla(absorb="yes"), TypeError, "absorb", "bool",
    r"'yes'")

# --- the transformer block and its PyTorch twin (chapter 12) ----------------------------------
bad("TransformerBlock/d_ff-0", lambda: TransformerBlock(8, 2, 0), ValueError, "d_ff",
    "positive int", r"\b0\b")
bad("TransformerBlock/activation", lambda: TransformerBlock(8, 2, 32, activation="tanh"),
    ValueError, "activation", r"'gelu', 'relu'", r"'tanh'")
bad("TransformerBlock/norm_first-str", lambda: TransformerBlock(8, 2, 32, norm_first="yes"),
    TypeError, "norm_first", "bool", r"'yes'")
bad("TransformerBlock/x-2d", lambda: TransformerBlock(8, 2, 32)(f32(5, 8)), ValueError, "x",
    r"3-D", shape(5, 8))
bad("TransformerBlock/feed_forward-width", lambda: TransformerBlock(8, 2, 32).feed_forward(
    f32(2, 7)), ValueError, "x", r"\(\.\.\., 8\)", r"\(2, 7\)")
bad("to_torch_encoder_layer/not-a-block", lambda: to_torch_encoder_layer(
    MultiHeadAttention(8, 2)), TypeError, "block", "TransformerBlock", r"MultiHeadAttention")
bad("to_torch_encoder_layer/gqa", lambda: to_torch_encoder_layer(
    TransformerBlock(8, 4, 32, num_kv_heads=2)), ValueError, "block",
    r"one key/value head per query head", r"GroupedQueryAttention")
bad("from_torch_encoder_layer/not-a-layer", lambda: from_torch_encoder_layer(nn.Linear(2, 2)),
    TypeError, "layer", "TransformerEncoderLayer", r"\bLinear\b")
bad("from_torch_encoder_layer/no-bias", lambda: from_torch_encoder_layer(
    nn.TransformerEncoderLayer(8, 2, 32, bias=False, batch_first=True)), ValueError, "layer",
    r"bias=True", r"without attention biases")
bad("from_torch_encoder_layer/tanh-gelu", lambda: from_torch_encoder_layer(
    nn.TransformerEncoderLayer(8, 2, 32, activation=nn.GELU(approximate="tanh"),
                               batch_first=True)), ValueError, "layer", r"'relu' or 'gelu'",
    r"approximate='tanh'")


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_bad_input_is_refused_with_a_message(case: Bad):
    torch.manual_seed(0)
    with pytest.raises(Exception) as excinfo:  # noqa: B017, PT011 - the type is checked below
        case.call()
    error, message = excinfo.value, str(excinfo.value)
    assert type(error) is case.error, f"{type(error).__name__}: {message}"
    raised_in = Path(excinfo.traceback[-1].path).resolve()
    assert LIBRARY in raised_in.parents, f"raised in {raised_in}, not in mha_lib: {message}"
    form = re.fullmatch(rf"{re.escape(case.arg)}: (?P<expected>.*)\bgot\b(?P<given>.*)",
                        message, re.S)
    assert form, f"not '{case.arg}: expected ..., got ...': {message!r}"
    assert re.search(r"\bexpected\b", form["expected"]), message
    assert re.search(case.expected, form["expected"]), f"{case.expected!r} not in {message!r}"
    assert re.search(case.given, form["given"]), f"{case.given!r} not in {message!r}"


def test_every_public_name_is_in_the_catalogue():
    """A new public function or class gets its bad-input cases here too."""
    covered = {c.id.split("/")[0].split("[")[0] for c in CASES}
    aliases = {"sdpa": "scaled_dot_product_attention", "MHA": "MultiHeadAttention",
               "sinusoidal": "sinusoidal_encoding", "D2L": "D2LMultiHeadAttention",
               "Einsum": "EinsumMultiHeadAttention"}
    covered = {aliases.get(name, name) for name in covered}
    assert set(mha_lib.__all__) - covered == set()


# ---------------------------------------------------------------------------------------------
# Empty sequences: defined results, not errors (see the module docstring)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("need_weights", [True, False])
def test_mha_no_keys_gives_zero_attention(need_weights):
    """Lk = 0: every query row is fully masked, the attention output is zero, and the module
    returns ``out_proj(0) = out_proj.bias`` for every query; gradients are finite."""
    torch.manual_seed(0)
    m = MultiHeadAttention(8, 2)
    q = torch.randn(2, 3, 8, requires_grad=True)
    empty = torch.randn(2, 0, 8)
    out, w = m(q, empty, empty, need_weights=need_weights)
    assert out.shape == (2, 3, 8)
    torch.testing.assert_close(out, m.out_proj.bias.expand(2, 3, 8))
    assert w is None if not need_weights else w.shape == (2, 2, 3, 0)
    out.sum().backward()
    assert torch.isfinite(q.grad).all()


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("B,Lq", [(2, 0), (0, 3)])
def test_mha_no_queries_or_no_samples_gives_empty_output(need_weights, B, Lq):
    torch.manual_seed(0)
    m = MultiHeadAttention(8, 2)
    out, w = m(torch.randn(B, Lq, 8), torch.randn(B, 4, 8), torch.randn(B, 4, 8),
               need_weights=need_weights)
    assert out.shape == (B, Lq, 8)
    assert w is None if not need_weights else w.shape == (B, 2, Lq, 4)


def test_attention_core_with_empty_sequences():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 0, 4), torch.randn(2, 0, 6)
    out, w = scaled_dot_product_attention(q, k, v)  # no keys: zeros
    assert w.shape == (2, 3, 0) and torch.equal(out, torch.zeros(2, 3, 6))
    out, w = scaled_dot_product_attention(torch.randn(2, 0, 4), torch.randn(2, 5, 4),
                                          torch.randn(2, 5, 6))  # no queries: empty
    assert out.shape == (2, 0, 6) and w.shape == (2, 0, 5)
    assert masked_softmax(torch.randn(3, 0), keep(3, 0)).shape == (3, 0)
    out = DotProductAttention(0.0)(q, k, v, torch.tensor([0, 0]))
    assert torch.equal(out, torch.zeros(2, 3, 6))


def test_variants_with_empty_sequences():
    torch.manual_seed(0)
    d2l = D2LMultiHeadAttention(5, 3, 7, 8, 2, 0.0)  # bias=False: zero attention -> zero output
    out = d2l(torch.randn(2, 3, 3), torch.randn(2, 0, 5), torch.randn(2, 0, 7), None)
    assert torch.equal(out, torch.zeros(2, 3, 8))
    # (no queries: refused, see test_bad_input_is_refused_with_a_message[D2L/no-queries])
    einsum = EinsumMultiHeadAttention(2, 8, 4, 3, dropout=0.0).eval()
    q = torch.randn(2, 3, 8)
    out, attn = einsum(q, torch.randn(2, 0, 8), torch.randn(2, 0, 8))
    assert attn.shape == (2, 2, 3, 0)
    expected = einsum.layer_norm(einsum.fc(torch.zeros(2, 3, 6)) + q)  # residual + LayerNorm
    torch.testing.assert_close(out, expected)
    out, attn = einsum(torch.randn(2, 0, 8), torch.randn(2, 4, 8), torch.randn(2, 4, 8))
    assert out.shape == (2, 0, 8) and attn.shape == (2, 2, 0, 4)


def test_masks_positions_and_text_with_empty_sequences():
    assert causal_mask(0).shape == (0, 0)
    assert causal_mask(0, 3).shape == (0, 3)
    assert padding_mask(torch.tensor([], dtype=torch.long)).shape == (0, 1, 1, 0)
    assert padding_mask(torch.tensor([0, 0])).shape == (2, 1, 1, 0)
    x = torch.randn(2, 0, 8)
    assert torch.equal(PositionalEncoding(8, dropout=0.0)(x), x)
    assert torch.equal(merge_heads(split_heads(x, 2)), x)
    assert transpose_qkv(x, 2).shape == (4, 0, 4)
    ids, lengths = encode([], STOI)  # no texts: an empty batch
    assert ids.shape == (0, 0) and lengths.shape == (0,)
    assert ids.dtype == lengths.dtype == torch.long  # not float32
    assert tokenize("") == [""]  # seed 001's tokenizer: "" splits into one empty token ...
    with pytest.raises(ValueError, match=r"^texts: .*got ''"):
        encode([""], STOI)  # ... which is in no vocabulary
