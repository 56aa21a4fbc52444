"""Chapter 12's checkers accept a right answer and refuse the usual wrong ones (a count
without the LayerNorms or the biases; a post-norm forward, a forgotten residual, the
attention pair returned whole)."""

from mha_lib.exercises import check_block_params, check_pre_norm


def block_params(d_model, d_ff):
    return 4 * d_model * d_model + 4 * d_model + 2 * d_model * d_ff + d_ff + d_model \
        + 4 * d_model


def pre_norm(block, x, mask=None):
    x = x + block.attn(block.norm1(x), mask=mask, need_weights=False)[0]
    return x + block.linear2(block.activation(block.linear1(block.norm2(x))))


def test_block_params_checker():
    assert check_block_params(block_params)
    no_norms = check_block_params(lambda d, f: block_params(d, f) - 4 * d)
    # 4 d_model is both the LayerNorms and the attention biases: the hint names both
    assert not no_norms and "LayerNorms' gamma and beta" in no_norms.message
    assert "attention biases" in no_norms.message
    nothing_but_matrices = check_block_params(lambda d, f: 4 * d * d + 2 * d * f)
    assert not nothing_but_matrices and "gamma and beta" in nothing_but_matrices.message
    no_ffn_bias = check_block_params(lambda d, f: block_params(d, f) - f - d)
    assert not no_ffn_bias and "FFN layers have biases" in no_ffn_bias.message
    assert str(block_params(8, 32)) not in no_ffn_bias.message  # never the answer
    two_matrices = check_block_params(lambda d, f: block_params(d, f) - 2 * d * d)
    assert not two_matrices and "four" in two_matrices.message
    raising = check_block_params(lambda d, f: 1 / 0)
    assert not raising and "ZeroDivisionError" in raising.message


def test_pre_norm_checker():
    assert check_pre_norm(pre_norm)

    def post_norm(block, x):
        x = block.norm1(x + block.attn(x, need_weights=False)[0])
        return block.norm2(x + block.linear2(block.activation(block.linear1(x))))

    post = check_pre_norm(post_norm)
    assert not post and "post-norm" in post.message

    def no_first_residual(block, x):
        a = block.attn(block.norm1(x), need_weights=False)[0]
        h = x + a
        return a + block.linear2(block.activation(block.linear1(block.norm2(h))))

    missing = check_pre_norm(no_first_residual)
    assert not missing and "residual" in missing.message

    def pair(block, x):
        return block.attn(block.norm1(x)), None

    returned_pair = check_pre_norm(pair)
    assert not returned_pair and "take [0]" in returned_pair.message

    def normed_stream(block, x):  # normalises the residual stream itself
        x = block.norm1(x)
        x = x + block.attn(x, need_weights=False)[0]
        x = block.norm2(x)
        return x + block.linear2(block.activation(block.linear1(x)))

    streamed = check_pre_norm(normed_stream)
    assert not streamed and "residual stream itself" in streamed.message

    def no_activation(block, x):
        x = x + block.attn(block.norm1(x), need_weights=False)[0]
        return x + block.linear2(block.linear1(block.norm2(x)))

    assert not check_pre_norm(no_activation)

    def maskless(block, x):  # right, but drops the mask: a decoder bug
        x = x + block.attn(block.norm1(x), need_weights=False)[0]
        return x + block.linear2(block.activation(block.linear1(block.norm2(x))))

    dropped = check_pre_norm(maskless)
    assert not dropped and "takes no mask" in dropped.message
