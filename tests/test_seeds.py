"""The library against the seed notebooks it grew from (transcribed in reference_seeds.py).

Each test builds the seed's module, copies its weights into the library's module by hand,
puts both in eval mode and compares outputs *and* attention weights.
"""

import pytest
import torch
import torch.nn as nn
from torch.testing import assert_close

try:
    import reference_seeds as ref
except ImportError:  # tests/ made a package
    from tests import reference_seeds as ref

from mha_lib import (
    D2LMultiHeadAttention,
    DotProductAttention,
    EinsumMultiHeadAttention,
    MultiHeadAttention,
    PositionalEncoding,
    build_vocab,
    causal_mask,
    encode,
    masked_softmax,
    merge_heads,
    padding_mask,
    scaled_dot_product_attention,
    sinusoidal_encoding,
    split_heads,
    tokenize,
    transpose_output,
    transpose_qkv,
)

param = pytest.mark.parametrize


def _copy_linear(dst: nn.Linear, src: nn.Linear) -> None:
    """dst <- src; a bias-free src gives dst a zero bias."""
    with torch.no_grad():
        dst.weight.copy_(src.weight)
        if dst.bias is not None:
            if src.bias is None:
                dst.bias.zero_()
            else:
                dst.bias.copy_(src.bias)
        else:
            assert src.bias is None


def _key_lengths_mask(valid_lens, max_len):
    """Seed-001 style (B, 1, 1, Lk) 1/0 float padding mask, built independently."""
    keep = torch.arange(max_len)[None, :] < valid_lens[:, None]
    return keep.float()[:, None, None, :]


# ---------------------------------------------------------------------------------------------
# Seed 000
# ---------------------------------------------------------------------------------------------


def _seed000_weights(seed, x):
    """The seed's own lines, stopped at `attention_weights` (the seed does not return them)."""
    b, n, d = x.shape
    h, dk = seed.num_heads, seed.d_k
    Q = seed.W_q(x).view(b, n, h, dk).transpose(1, 2)
    K = seed.W_k(x).view(b, n, h, dk).transpose(1, 2)
    return torch.softmax(torch.matmul(Q, K.transpose(-2, -1)) / (dk**0.5), dim=-1)


@param("d_model,num_heads,batch,seq_len", [(64, 8, 2, 10), (12, 3, 3, 5), (8, 1, 1, 4)])
@param("need_weights", [True, False])
def test_seed000_self_attention(d_model, num_heads, batch, seq_len, need_weights):
    torch.manual_seed(0)
    seed = ref.Seed000MultiHeadAttention(d_model, num_heads).eval()
    lib = MultiHeadAttention(d_model, num_heads).eval()
    _copy_linear(lib.q_proj, seed.W_q)
    _copy_linear(lib.k_proj, seed.W_k)
    _copy_linear(lib.v_proj, seed.W_v)
    _copy_linear(lib.out_proj, seed.W_o)
    x = torch.randn(batch, seq_len, d_model)
    with torch.no_grad():
        expected = seed(x)
        out, weights = lib(x, need_weights=need_weights)
        expected_w = _seed000_weights(seed, x)
    assert out.shape == (batch, seq_len, d_model)
    assert_close(out, expected, atol=1e-5, rtol=1e-5)
    if need_weights:
        assert weights.shape == (batch, num_heads, seq_len, seq_len)
        assert_close(weights, expected_w)
    else:
        assert weights is None


# ---------------------------------------------------------------------------------------------
# Seed 001: text pipeline
# ---------------------------------------------------------------------------------------------

EXTRA_TEXTS = [
    "Hello, World!",
    "A  double  space. And? trailing?",
    "MiXeD Case? yes.",
    "",
]


@param("text", ref.SEED001_SEQUENCES + EXTRA_TEXTS)
def test_seed001_tokenize(text):
    torch.manual_seed(0)
    assert tokenize(text) == ref.seed001_tokenize(text)


def test_seed001_tokenize_keeps_comma():
    torch.manual_seed(0)
    assert tokenize("Hello, what is a basic split?") == [
        "hello,",
        "what",
        "is",
        "a",
        "basic",
        "split",
    ]


@param("texts", [ref.SEED001_SEQUENCES, EXTRA_TEXTS[:3], ["b a c", "c a"]])
def test_seed001_build_vocab(texts):
    torch.manual_seed(0)
    assert build_vocab(texts) == ref.seed001_build_vocab(texts)


def test_seed001_vocab_size_14():
    torch.manual_seed(0)
    stoi = build_vocab(ref.SEED001_SEQUENCES)
    assert len(stoi) == 14
    assert sorted(stoi.values()) == list(range(14))


def test_build_vocab_specials_come_first():
    torch.manual_seed(0)
    plain = ref.seed001_build_vocab(ref.SEED001_SEQUENCES)
    stoi = build_vocab(ref.SEED001_SEQUENCES, specials=("<pad>", "<unk>"))
    assert stoi["<pad>"] == 0 and stoi["<unk>"] == 1
    assert len(stoi) == 16
    # the rest keep the seed's sorted order, shifted past the specials
    assert {w: i - 2 for w, i in stoi.items() if not w.startswith("<")} == plain


def test_seed001_encode_matches_seed_tensor():
    torch.manual_seed(0)
    stoi = ref.seed001_build_vocab(ref.SEED001_SEQUENCES)
    tokenized = [ref.seed001_tokenize(s) for s in ref.SEED001_SEQUENCES]
    expected = torch.tensor([[stoi[w] for w in seq] for seq in tokenized]).long()  # 3x6
    ids, lengths = encode(ref.SEED001_SEQUENCES, stoi)
    assert ids.dtype == torch.long and lengths.dtype == torch.long
    assert_close(ids, expected)
    assert_close(lengths, torch.tensor([6, 6, 6]))


def test_encode_pads_to_longest():
    torch.manual_seed(0)
    texts = ["a b c", "c", "b a"]
    stoi = build_vocab(texts, specials=("<pad>",))
    ids, lengths = encode(texts, stoi, pad_id=stoi["<pad>"])
    a, b, c = stoi["a"], stoi["b"], stoi["c"]
    assert_close(ids, torch.tensor([[a, b, c], [c, 0, 0], [b, a, 0]]))
    assert_close(lengths, torch.tensor([3, 1, 2]))


@param("d_model", [8, 16, 64])
@param("max_len", [10, 50])
def test_seed001_positional_encoding(d_model, max_len):
    torch.manual_seed(0)
    seed = ref.Seed001PositionalEncoding(d_model=d_model, dropout=0.1, max_length=max_len).eval()
    lib = PositionalEncoding(d_model, dropout=0.1, max_len=max_len).eval()
    assert lib.pe.shape == (1, max_len, d_model)
    assert_close(lib.pe, seed.pe)
    table = sinusoidal_encoding(max_len, d_model)
    assert table.dtype == torch.float32 and table.shape == (max_len, d_model)
    assert_close(table, seed.pe[0])
    x = torch.randn(3, max_len - 3, d_model)
    assert_close(lib(x), seed(x))


def test_positional_encoding_is_a_buffer_not_a_parameter():
    torch.manual_seed(0)
    lib = PositionalEncoding(8, max_len=10)
    assert "pe" in dict(lib.named_buffers())
    assert "pe" not in dict(lib.named_parameters())


def _seed001_running_example(d_model=8):
    """Seed 001's pipeline: text -> ids -> nn.Embedding(14, 8) -> PositionalEncoding -> X."""
    stoi = ref.seed001_build_vocab(ref.SEED001_SEQUENCES)
    tokenized = [ref.seed001_tokenize(s) for s in ref.SEED001_SEQUENCES]
    tensor_seq = torch.tensor([[stoi[w] for w in seq] for seq in tokenized]).long()
    emb = nn.Embedding(len(stoi), d_model)
    pos = ref.Seed001PositionalEncoding(d_model=d_model, dropout=0.1, max_length=10).eval()
    with torch.no_grad():
        return pos(emb(tensor_seq))


def _seed001_pair(d_model, n_heads):
    seed = ref.Seed001MultiHeadAttention(d_model, n_heads, dropout=0.1).eval()
    lib = MultiHeadAttention(d_model, n_heads, dropout=0.1).eval()
    _copy_linear(lib.q_proj, seed.Wq)
    _copy_linear(lib.k_proj, seed.Wk)
    _copy_linear(lib.v_proj, seed.Wv)
    _copy_linear(lib.out_proj, seed.Wo)
    return seed, lib


@param("need_weights", [True, False])
def test_seed001_running_example_self_attention(need_weights):
    torch.manual_seed(0)
    X = _seed001_running_example()
    assert X.shape == (3, 6, 8)
    seed, lib = _seed001_pair(8, 4)
    with torch.no_grad():
        expected, expected_w = seed(X, X, X)
        out, w = lib(X, X, X, need_weights=need_weights)
    assert_close(out, expected, atol=1e-5, rtol=1e-5)
    if need_weights:
        assert w.shape == (3, 4, 6, 6)
        assert_close(w, expected_w)


def test_seed001_running_example_library_pipeline():
    torch.manual_seed(0)
    emb = nn.Embedding(14, 8)
    seed_pe = ref.Seed001PositionalEncoding(d_model=8, dropout=0.1, max_length=10).eval()
    stoi = ref.seed001_build_vocab(ref.SEED001_SEQUENCES)
    seed_ids = torch.tensor(
        [[stoi[w] for w in ref.seed001_tokenize(s)] for s in ref.SEED001_SEQUENCES]
    )
    lib_stoi = build_vocab(ref.SEED001_SEQUENCES)
    lib_ids, _ = encode(ref.SEED001_SEQUENCES, lib_stoi)
    lib_pe = PositionalEncoding(8, dropout=0.1, max_len=10).eval()
    with torch.no_grad():
        assert_close(lib_pe(emb(lib_ids)), seed_pe(emb(seed_ids)))


def test_seed001_inline_steps():
    """Seed 001's step-by-step cells (bias-free Wq/Wk/Wv, view/permute, softmax, concat)."""
    torch.manual_seed(0)
    X = _seed001_running_example()
    d_model, n_heads = 8, 4
    Wq, Wk, Wv = (nn.Linear(d_model, d_model, bias=False) for _ in range(3))
    with torch.no_grad():
        Q, K, V = Wq(X), Wk(X), Wv(X)
        batch_size, d_key = Q.size(0), d_model // n_heads
        Qh = Q.view(batch_size, -1, n_heads, d_key).permute(0, 2, 1, 3)
        Kh = K.view(batch_size, -1, n_heads, d_key).permute(0, 2, 1, 3)
        Vh = V.view(batch_size, -1, n_heads, d_key).permute(0, 2, 1, 3)
        assert_close(split_heads(Q, n_heads), Qh)
        assert_close(split_heads(K, n_heads), Kh)
        scaled = torch.matmul(Qh, Kh.permute(0, 1, 3, 2)) / (d_key**0.5)
        attn_probs = torch.softmax(scaled, dim=-1)
        A = torch.matmul(attn_probs, Vh)
        out, w = scaled_dot_product_attention(Qh, Kh, Vh)
        assert_close(w, attn_probs)
        assert_close(out, A)
        A_cat = A.permute(0, 2, 1, 3).contiguous().view(batch_size, -1, n_heads * d_key)
        assert_close(merge_heads(A), A_cat)


@param("float_mask", [True, False])
@param("need_weights", [True, False])
@param("lq,lk", [(4, 7), (7, 3), (5, 5)])
def test_seed001_cross_attention_padding(float_mask, need_weights, lq, lk):
    torch.manual_seed(0)
    seed, lib = _seed001_pair(16, 4)
    B = 3
    q, kv = torch.randn(B, lq, 16), torch.randn(B, lk, 16)
    valid = torch.tensor([lk, 1, max(1, lk - 2)])
    seed_mask = _key_lengths_mask(valid, lk)
    if not float_mask:
        seed_mask = seed_mask.bool()
    lib_mask = padding_mask(valid, max_len=lk)
    assert lib_mask.dtype == torch.bool and lib_mask.shape == (B, 1, 1, lk)
    assert_close(lib_mask, seed_mask.bool())
    with torch.no_grad():
        expected, expected_w = seed(q, kv, kv, seed_mask)
        out, w = lib(q, kv, kv, mask=lib_mask, need_weights=need_weights)
    assert_close(out, expected, atol=1e-5, rtol=1e-5)
    if need_weights:
        assert w.shape == (B, 4, lq, lk)
        assert_close(w, expected_w)


@param("need_weights", [True, False])
@param("with_padding", [True, False])
def test_seed001_causal(need_weights, with_padding):
    torch.manual_seed(0)
    seed, lib = _seed001_pair(8, 2)
    B, L = 2, 6
    x = torch.randn(B, L, 8)
    seed_mask = torch.tril(torch.ones(L, L))  # 1 = may attend, the seed's convention
    lib_mask = causal_mask(L)
    assert_close(lib_mask, seed_mask.bool())
    if with_padding:
        valid = torch.tensor([6, 3])
        seed_mask = seed_mask * _key_lengths_mask(valid, L)  # (B, 1, L, L)
        lib_mask = lib_mask & padding_mask(valid, max_len=L)
    with torch.no_grad():
        expected, expected_w = seed(x, x, x, seed_mask)
        out, w = lib(x, mask=lib_mask, need_weights=need_weights)
    assert_close(out, expected, atol=1e-5, rtol=1e-5)
    if need_weights:
        assert_close(w, expected_w)


def test_seed001_cross_attention_causal_mask_non_square():
    torch.manual_seed(0)
    seed, lib = _seed001_pair(8, 2)
    q, kv = torch.randn(2, 3, 8), torch.randn(2, 5, 8)
    mask = causal_mask(3, 5)
    with torch.no_grad():
        expected, expected_w = seed(q, kv, kv, mask)  # bool mask: `mask == 0` blocks False
        out, w = lib(q, kv, kv, mask=mask)
    assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert_close(w, expected_w)


# ---------------------------------------------------------------------------------------------
# Seed 002: its own three tests, run against the library class
# ---------------------------------------------------------------------------------------------


def test_seed002_attention_output_shape():
    torch.manual_seed(0)
    attn = MultiHeadAttention(64, 4)
    x = torch.randn(2, 10, 64)
    output, weights = attn(x)
    assert output.shape == x.shape


def test_seed002_attention_weights_sum_to_one():
    torch.manual_seed(0)
    attn = MultiHeadAttention(64, 4)
    x = torch.randn(2, 10, 64)
    output, weights = attn(x)
    row_sums = weights.sum(dim=-1)
    assert torch.allclose(row_sums, torch.ones_like(row_sums), atol=1e-5)


def test_seed002_masked_attention():
    torch.manual_seed(0)
    attn = MultiHeadAttention(64, 4)
    x = torch.randn(1, 5, 64)
    # the seed's 1/0 float mask, in the project's convention: bool, True = may attend
    mask = ref.create_causal_mask(5).bool()
    output, weights = attn(x, mask=mask)
    # Upper triangle should be ~0 (masked out)
    assert weights[0, :, 0, 1].max() < 1e-5
    upper = ~torch.tril(torch.ones(5, 5, dtype=torch.bool))
    assert weights[0][:, upper].abs().max() < 1e-6


@param("masked", [False, True])
@param("need_weights", [True, False])
def test_seed002_equals_library(masked, need_weights):
    torch.manual_seed(0)
    seed = ref.Seed002MultiHeadAttention(embed_dim=64, num_heads=4).eval()
    lib = MultiHeadAttention(64, 4, dropout=0.1).eval()
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        _copy_linear(getattr(lib, name), getattr(seed, name))
    x = torch.randn(2, 7, 64)
    seed_mask = ref.create_causal_mask(7) if masked else None
    lib_mask = causal_mask(7) if masked else None
    with torch.no_grad():
        expected, expected_w = seed(x, mask=seed_mask)
        out, w = lib(x, mask=lib_mask, need_weights=need_weights)
    assert_close(out, expected, atol=1e-5, rtol=1e-5)
    if need_weights:
        assert_close(w, expected_w)


# ---------------------------------------------------------------------------------------------
# Seed 003: d2l
# ---------------------------------------------------------------------------------------------


def _seed003_pair(key_size, query_size, value_size, num_hiddens, num_heads, bias):
    seed = ref.Seed003MultiHeadAttention(
        key_size, query_size, value_size, num_hiddens, num_heads, 0.5, bias=bias
    ).eval()
    lib = D2LMultiHeadAttention(
        key_size, query_size, value_size, num_hiddens, num_heads, 0.5, bias=bias
    ).eval()
    for name in ("W_q", "W_k", "W_v", "W_o"):
        _copy_linear(getattr(lib, name), getattr(seed, name))
    assert lib.num_heads == num_heads
    return seed, lib


def test_seed003_own_example():
    torch.manual_seed(0)
    num_hiddens, num_heads = 100, 5
    seed, lib = _seed003_pair(num_hiddens, num_hiddens, num_hiddens, num_hiddens, num_heads, False)
    batch_size, num_queries, valid_lens = 2, 4, torch.tensor([3, 2])
    X = torch.ones((batch_size, num_queries, num_hiddens))
    with torch.no_grad():
        out = lib(X, X, X, valid_lens)
        expected = seed(X, X, X, valid_lens)
    assert out.shape == (2, 4, 100)
    assert_close(out, expected, atol=1e-5, rtol=1e-5)


@param("bias", [False, True])
@param("valid_kind", ["none", "1d", "2d"])
@param("num_heads", [1, 3])
def test_seed003_d2l_multihead(bias, valid_kind, num_heads):
    torch.manual_seed(0)
    key_size, query_size, value_size, num_hiddens = 7, 5, 4, 12
    B, Lq, Lk = 2, 4, 6
    seed, lib = _seed003_pair(key_size, query_size, value_size, num_hiddens, num_heads, bias)
    queries = torch.randn(B, Lq, query_size)
    keys = torch.randn(B, Lk, key_size)
    values = torch.randn(B, Lk, value_size)
    if valid_kind == "none":
        valid_lens = None
    elif valid_kind == "1d":
        valid_lens = torch.tensor([3, 6])
    else:
        valid_lens = torch.randint(1, Lk + 1, (B, Lq))
    with torch.no_grad():
        expected = seed(queries, keys, values, valid_lens)
        out = lib(queries, keys, values, valid_lens)
    assert out.shape == (B, Lq, num_hiddens)
    assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert_close(lib.attention.attention_weights, seed.attention.attention_weights)


@param("valid_kind", ["none", "1d", "2d"])
@param("lq,lk,d,dv", [(3, 5, 4, 6), (5, 2, 3, 3)])
def test_seed003_dot_product_attention(valid_kind, lq, lk, d, dv):
    torch.manual_seed(0)
    B = 3
    q, k, v = torch.randn(B, lq, d), torch.randn(B, lk, d), torch.randn(B, lk, dv)
    if valid_kind == "none":
        valid_lens = None
    elif valid_kind == "1d":
        valid_lens = torch.randint(1, lk + 1, (B,))
    else:
        valid_lens = torch.randint(1, lk + 1, (B, lq))
    seed = ref.D2LDotProductAttention(0.3).eval()
    lib = DotProductAttention(0.3).eval()
    expected = seed(q, k, v, valid_lens)
    out = lib(q, k, v, valid_lens)
    assert_close(out, expected)
    assert_close(lib.attention_weights, seed.attention_weights)


@param("two_d", [False, True])
def test_seed003_masked_softmax_with_padding_mask(two_d):
    torch.manual_seed(0)
    B, Lq, Lk = 2, 3, 5
    X = torch.randn(B, Lq, Lk)
    valid = torch.randint(1, Lk + 1, (B, Lq) if two_d else (B,))
    expected = ref.d2l_masked_softmax(X.clone(), valid)
    mask = padding_mask(valid, max_len=Lk).squeeze(1)  # (B, 1|Lq, Lk)
    assert_close(masked_softmax(X, mask), expected)


@param("shape,h", [((2, 5, 12), 3), ((1, 1, 8), 8), ((3, 4, 6), 1)])
def test_seed003_transpose_helpers(shape, h):
    torch.manual_seed(0)
    X = torch.randn(*shape)
    assert_close(transpose_qkv(X, h), ref.seed003_transpose_qkv(X, h))
    Y = torch.randn(shape[0] * h, shape[1], 5)
    assert_close(transpose_output(Y, h), ref.seed003_transpose_output(Y, h))


def test_seed003_valid_len_zero_differs_from_d2l():
    """d2l fills with -1e6, so a row with valid_len 0 is uniform there; mha_lib gives zeros."""
    torch.manual_seed(0)
    seed, lib = _seed003_pair(6, 6, 6, 6, 2, False)
    q, kv = torch.randn(2, 3, 6), torch.randn(2, 4, 6)
    valid_lens = torch.tensor([0, 3])
    with torch.no_grad():
        out = lib(q, kv, kv, valid_lens)
        expected = seed(q, kv, kv, valid_lens)
    assert torch.isfinite(out).all()
    # bias-free W_o: zero attention output before W_o -> exactly zero output
    assert_close(out[0], torch.zeros_like(out[0]))
    assert_close(lib.attention.attention_weights[:2], torch.zeros(2, 3, 4))
    # the d2l reference attends uniformly instead, so the outputs must differ there ...
    assert_close(seed.attention.attention_weights[:2], torch.full((2, 3, 4), 0.25))
    assert out[0].abs().max() < expected[0].abs().max()
    # ... and agree on the row that has valid keys
    assert_close(out[1], expected[1], atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# Seed 004: einsum / einops
# ---------------------------------------------------------------------------------------------


def _seed004_pair(n_head, d_model, d_k, d_v):
    seed = ref.Seed004MultiHeadAttentionNew(n_head, d_model, d_k, d_v, dropout=0.1).eval()
    lib = EinsumMultiHeadAttention(n_head, d_model, d_k, d_v, dropout=0.1).eval()
    for name in ("w_qs", "w_ks", "w_vs", "fc"):
        _copy_linear(getattr(lib, name), getattr(seed, name))
    lib.layer_norm.load_state_dict(seed.layer_norm.state_dict())
    assert lib.n_head == n_head
    return seed, lib


@param("mask_kind", ["none", "random", "causal"])
@param("n_head,d_model,d_k,d_v", [(4, 16, 6, 5), (1, 6, 3, 7)])
@param("lq,lk", [(5, 5), (3, 6), (6, 2)])
def test_seed004_einsum(mask_kind, n_head, d_model, d_k, d_v, lq, lk):
    torch.manual_seed(0)
    seed, lib = _seed004_pair(n_head, d_model, d_k, d_v)
    B = 2
    with torch.no_grad():  # a trained-looking LayerNorm, not the identity one
        seed.layer_norm.weight.uniform_(0.5, 1.5)
        seed.layer_norm.bias.uniform_(-0.5, 0.5)
        lib.layer_norm.load_state_dict(seed.layer_norm.state_dict())
    q = torch.randn(B, lq, d_model)
    k, v = torch.randn(B, lk, d_model), torch.randn(B, lk, d_model)
    if mask_kind == "none":
        seed_mask = None
    else:
        if mask_kind == "random":
            seed_mask = torch.rand(B, lq, lk) < 0.4  # True = blocked (seed convention)
        else:
            seed_mask = (~causal_mask(lq, lk)).expand(B, lq, lk).clone()
        seed_mask[..., 0] = False  # every row keeps a key (the seed gives NaN otherwise)
    with torch.no_grad():
        expected, expected_attn = seed(q, k, v, mask=seed_mask)
        lib_mask = None if seed_mask is None else ~seed_mask
        out, attn = lib(q, k, v, mask=lib_mask)
    assert out.shape == (B, lq, d_model)
    assert attn.shape == (n_head, B, lq, lk)
    assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert_close(attn, expected_attn)


def test_seed004_fully_masked_row_is_zero_not_nan():
    """The seed gives NaN for a query that may attend to nothing; mha_lib gives zero weights."""
    torch.manual_seed(0)
    seed, lib = _seed004_pair(2, 8, 4, 4)
    q, kv = torch.randn(2, 3, 8), torch.randn(2, 4, 8)
    seed_mask = torch.zeros(2, 3, 4, dtype=torch.bool)
    seed_mask[1, 2] = True  # batch 1, query 2: everything blocked
    with torch.no_grad():
        expected, _ = seed(q, kv, kv, mask=seed_mask)
        out, attn = lib(q, kv, kv, mask=~seed_mask)
    assert torch.isnan(expected[1, 2]).all()
    assert torch.isfinite(out).all() and torch.isfinite(attn).all()
    assert_close(attn[:, 1, 2], torch.zeros(2, 4))
    assert_close(out[0], expected[0], atol=1e-5, rtol=1e-5)


@param("form", ["2d", "4d"])
def test_seed004_other_mask_forms(form):
    """A (Lq, Lk) mask is shared by the batch and the heads; a (B, H, Lq, Lk) mask that repeats
    one (B, Lq, Lk) mask over the heads gives the seed's result for that mask."""
    torch.manual_seed(0)
    seed, lib = _seed004_pair(3, 9, 4, 2)
    B, lq, lk = 2, 4, 5
    q, k, v = torch.randn(B, lq, 9), torch.randn(B, lk, 9), torch.randn(B, lk, 9)
    if form == "2d":
        blocked = torch.rand(lq, lk) < 0.5
        blocked[:, 0] = False
        seed_mask, lib_mask = blocked.expand(B, lq, lk), ~blocked
    else:
        seed_mask = torch.rand(B, lq, lk) < 0.5
        seed_mask[..., 0] = False
        lib_mask = (~seed_mask)[:, None].expand(B, 3, lq, lk)
    with torch.no_grad():
        expected, expected_attn = seed(q, k, v, mask=seed_mask)
        out, attn = lib(q, k, v, mask=lib_mask)
    assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert_close(attn, expected_attn)
