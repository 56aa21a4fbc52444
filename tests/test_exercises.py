"""Exercise checkers say Correct to right answers and Not yet to wrong ones.

The notebooks' stored solutions show the Correct side for every checker; these tests
show that the checkers can also say no (a checker that accepts anything is a defect).
"""

import torch

from mha_lib import build_vocab, encode, tokenize
from mha_lib.exercises import (
    SENTENCES,
    check_einsum_num_parameters,
    check_num_parameters,
    check_padded_batch,
    check_tokenizer,
    check_vocab,
)
from mha_lib.exercises.verdict import check_calls


def test_check_calls_reports_the_first_wrong_or_raising_call():
    square = lambda n: n * n  # noqa: E731
    assert check_calls(square, [(2,), (3,)], square, "ok")
    wrong = check_calls(lambda n: n + n, [(2,), (3,)], square, "ok")
    # how far off and in which direction, never the expected number
    assert not wrong and "fn(3) = 6 is too small, by 10 % to a factor of 2" in wrong.message
    assert "9" not in wrong.message
    raising = check_calls(lambda n: 1 / 0, [(2,)], square, "ok")
    assert not raising and "ZeroDivisionError" in repr(raising)


def test_chapter_1_checkers():
    assert check_tokenizer(lambda text: tokenize(text.replace(",", "")))
    assert not check_tokenizer(tokenize)  # keeps "hello,"
    stoi = build_vocab(SENTENCES, specials=("<pad>",))
    assert check_vocab(stoi)
    assert not check_vocab(build_vocab(SENTENCES))  # no <pad>
    ids, lengths = encode(["What will come next?", "A basic split!"], stoi, pad_id=0)
    assert check_padded_batch(ids, lengths)
    assert not check_padded_batch(ids.flip(0), lengths.flip(0))
    assert not check_padded_batch(ids, torch.tensor([4, 4]))


def test_parameter_count_checkers():
    assert check_num_parameters(lambda d, h, bias: 4 * d * d + (4 * d if bias else 0))
    assert not check_num_parameters(lambda d, h, bias: 4 * d * d)
    assert check_einsum_num_parameters(
        lambda h, d, dk, dv: d * h * dk * 2 + h * dk * 2 + d * h * dv + h * dv
        + h * dv * d + d + 2 * d)
    assert not check_einsum_num_parameters(lambda h, d, dk, dv: 0)


def test_chapter_2_checkers():
    from torch import nn

    from mha_lib.exercises.chapter02 import (
        check_embedding_parameters,
        check_onehot_embedding,
        check_padding_embedding,
    )

    F = torch.nn.functional
    assert check_onehot_embedding(lambda ids, w: F.one_hot(ids, len(w)).to(w) @ w)
    assert not check_onehot_embedding(lambda ids, w: F.one_hot(ids, len(w)).float() @ w + 1)
    looked_up = check_onehot_embedding(lambda ids, w: F.embedding(ids, w))
    assert not looked_up and "indexing" in looked_up.message  # the stated constraint
    stoi = build_vocab(SENTENCES, specials=("<pad>",))
    ids, _ = encode([*SENTENCES, "What is next?"], stoi, pad_id=0)
    good = nn.Embedding(len(stoi), 8, padding_idx=0)
    assert check_padding_embedding(good, good(ids))
    no_pad = nn.Embedding(len(stoi), 8)  # row 0 is random, not zeros
    assert not check_padding_embedding(no_pad, no_pad(ids))
    assert check_embedding_parameters(50257 * 768)
    assert not check_embedding_parameters(50257 * 768 + 768)  # a bias it does not have


def test_chapter_3_checkers():
    from mha_lib.exercises.chapter03 import check_shift_matrix, check_sinusoidal
    from mha_lib.positional import sinusoidal_encoding

    def power(n, d):
        angles = torch.arange(n)[:, None] / 10000.0 ** (torch.arange(0, d, 2) / d)
        return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)

    assert check_sinusoidal(power)
    assert not check_sinusoidal(lambda n, d: power(n, d).flip(-1))  # (cos, sin) order
    library = check_sinusoidal(sinusoidal_encoding)  # exp and log: not this exercise's way
    assert not library and "exp and log" in library.message
    assert "right numbers" in library.message
    late = check_sinusoidal(lambda n, d: sinusoidal_encoding(n + 1, d)[1:])
    assert not late and "start at 1" in late.message  # values first
    omega = 10000.0 ** (-torch.arange(0, 8, 2) / 8)
    blocks = [torch.tensor([[torch.cos(3 * w), -torch.sin(3 * w)],
                            [torch.sin(3 * w), torch.cos(3 * w)]]) for w in omega]
    assert check_shift_matrix(torch.block_diag(*blocks), k=3)
    assert not check_shift_matrix(torch.block_diag(*blocks).T, k=3)  # rotates backwards
    assert not check_shift_matrix(torch.eye(8), k=3)


def test_chapter_4_checkers():
    from mha_lib.exercises.chapter04 import (
        check_fused_projection,
        check_projection,
        check_projection_parameters,
    )

    assert check_projection(lambda x, w, b: x @ w.T + b)
    assert not check_projection(lambda x, w, b: x @ w + b)  # fails when d_in != d_out
    def fused(x, m):
        layers = (m.q_proj, m.k_proj, m.v_proj)
        return torch.nn.functional.linear(
            x, torch.cat([p.weight for p in layers]),
            torch.cat([p.bias for p in layers])).chunk(3, dim=-1)

    assert check_fused_projection(fused)
    assert not check_fused_projection(lambda x, m: [fused(x, m)[i] for i in (0, 2, 1)])
    three = check_fused_projection(lambda x, m: (m.q_proj(x), m.k_proj(x), m.v_proj(x)))
    assert not three and "one matrix product per projection" in three.message
    assert check_projection_parameters(3 * (512 * 512 + 512))
    assert not check_projection_parameters(3 * 512 * 512)


def test_chapter_5_checkers():
    from mha_lib.exercises.chapter05 import (
        check_head_columns,
        check_merge_heads,
        check_split_heads,
    )
    from mha_lib.heads import merge_heads, split_heads

    assert check_split_heads(lambda x, h: x.unflatten(-1, (h, -1)).permute(0, 2, 1, 3))
    wrong = check_split_heads(lambda x, h: x.reshape(x.size(0), h, x.size(1), -1))
    assert not wrong and "mixes tokens" in repr(wrong)
    # Right values with the chapter's transpose: accepted, with a pointer to permute
    transposed = check_split_heads(split_heads)
    assert transposed and "permute" in transposed.message
    assert check_merge_heads(lambda x: x.permute(0, 2, 1, 3).flatten(2))
    merged = check_merge_heads(merge_heads)  # transpose: accepted, permute suggested
    assert merged and "permute" in merged.message
    assert not check_merge_heads(lambda x: x.reshape(x.size(0), x.size(2), -1))
    assert check_head_columns(lambda x, h, n: x.chunk(n, dim=-1)[h])
    assert not check_head_columns(lambda x, h, n: split_heads(x, n)[:, h])  # reshapes
    assert not check_head_columns(lambda x, h, n: x[..., h::n])  # strided, not a block


def test_chapter_6_checkers():
    import math

    from mha_lib.attention import scaled_dot_product_attention
    from mha_lib.exercises.chapter06 import (
        check_attention,
        check_softmax_jacobian,
        check_temperature,
    )

    assert check_attention(scaled_dot_product_attention)
    unscaled = lambda q, k, v: scaled_dot_product_attention(q, k, v, scale=1.0)  # noqa: E731
    assert not check_attention(unscaled)
    assert check_temperature(lambda q, k, v, tau: scaled_dot_product_attention(
        q, k, v, scale=1 / (tau * math.sqrt(q.size(-1)))))
    assert not check_temperature(lambda q, k, v, tau: scaled_dot_product_attention(
        q, k, v, scale=tau / math.sqrt(q.size(-1))))  # multiplies by tau instead
    jac = lambda s: torch.diag(s.softmax(-1)) - torch.outer(s.softmax(-1), s.softmax(-1))  # noqa: E731
    assert check_softmax_jacobian(jac)
    assert not check_softmax_jacobian(lambda s: torch.diag(s.softmax(-1)))


def test_chapter_7_checkers():
    from mha_lib.attention import masked_softmax
    from mha_lib.exercises.chapter07 import (
        check_decoder_mask,
        check_padding_mask,
        check_safe_softmax,
    )
    from mha_lib.masks import causal_mask, padding_mask

    def from_lengths(n, m):
        return (torch.arange(m) < n[:, None])[:, None, None]

    assert check_padding_mask(from_lengths)
    assert not check_padding_mask(lambda n, m: from_lengths(n + 1, m))  # one too many
    library = check_padding_mask(padding_mask)  # "without padding_mask"
    assert not library and "without it" in library.message
    library = lambda n: padding_mask(n) & causal_mask(int(n.max()))  # noqa: E731
    assert not check_decoder_mask(library)  # "without padding_mask or causal_mask"
    decoder = lambda n: from_lengths(n, int(n.max())) & torch.ones(  # noqa: E731
        int(n.max()), int(n.max()), dtype=torch.bool).tril()
    assert check_decoder_mask(decoder)
    assert not check_decoder_mask(lambda n: padding_mask(n).expand(-1, 1, int(n.max()), -1))
    assert check_safe_softmax(masked_softmax)
    finite = check_safe_softmax(lambda s, m: torch.softmax(s.masked_fill(~m, -1e9), -1))
    assert not finite and "sees no key" in finite.message
    assert not check_safe_softmax(lambda s, m: masked_softmax(s.float(), m))  # wrong dtype
