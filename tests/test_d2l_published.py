"""mha_lib.d2l_published keeps d2l 1.0's text (section 11.3, PyTorch tab)."""

import inspect

import torch

from mha_lib.d2l_published import DotProductAttention, masked_softmax


def test_dot_product_attention_has_d2l_1_0_signature():
    # d2l 1.0: __init__(self, dropout), forward(..., valid_lens=None); the
    # num_heads / window_mask arguments belong to an earlier draft
    init = list(inspect.signature(DotProductAttention.__init__).parameters)
    forward = list(inspect.signature(DotProductAttention.forward).parameters)
    assert init == ["self", "dropout"]
    assert forward == ["self", "queries", "keys", "values", "valid_lens"]


def test_dot_product_attention_masks_by_length():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 2)
    lens = torch.tensor([5, 2])
    out = DotProductAttention(dropout=0.0)(q, k, v, lens)
    scores = q @ k.transpose(1, 2) / 2.0
    weights = masked_softmax(scores.clone(), lens)
    assert torch.all(weights[1, :, 2:] == 0)
    torch.testing.assert_close(out, weights @ v)
