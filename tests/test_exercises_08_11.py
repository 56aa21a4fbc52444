"""The checkers of Exercises 8.2 and 10.2 say yes to the right answer and no to the
usual wrong ones (the other checkers of chapters 8 to 11 run in their chapters)."""

from __future__ import annotations

import torch

import mha_lib.exercises
from mha_lib import MultiHeadAttention, causal_mask, padding_mask
from mha_lib.exercises.chapter08 import check_masked_self_attention
from mha_lib.exercises.chapter10 import check_einops_mask


def _padded_batch() -> tuple[MultiHeadAttention, torch.Tensor, torch.Tensor]:
    torch.manual_seed(8)
    mha = MultiHeadAttention(8, 4).eval()
    x = torch.randn(4, 6, 8)  # (B, L, d_model)
    return mha, x, torch.tensor([6, 6, 6, 3])


def test_masked_self_attention_checker_accepts_padding_and_causal():
    mha, x, lengths = _padded_batch()
    with torch.no_grad():
        output, _ = mha(x, mask=padding_mask(lengths) & causal_mask(6))
    assert check_masked_self_attention(mha, x, lengths, output)


def test_masked_self_attention_checker_refuses_one_mask_alone():
    mha, x, lengths = _padded_batch()
    with torch.no_grad():
        only_padding, _ = mha(x, mask=padding_mask(lengths))
        only_causal, _ = mha(x, mask=causal_mask(6))
    verdict = check_masked_self_attention(mha, x, lengths, only_padding)
    assert not verdict and "padding mask alone" in verdict.message
    verdict = check_masked_self_attention(mha, x, lengths, only_causal)
    assert not verdict and "causal mask alone" in verdict.message


def test_masked_self_attention_checker_refuses_bad_arguments():
    mha, x, lengths = _padded_batch()
    with torch.no_grad():
        output, _ = mha(x, mask=padding_mask(lengths) & causal_mask(6))
    assert not check_masked_self_attention(mha, x, lengths[:3], output)
    assert not check_masked_self_attention(mha, x[..., :6], lengths, output)
    assert not check_masked_self_attention(mha, x, lengths, output[:, :5])


def _einops_mask(valid_lens: torch.Tensor, length: int) -> torch.Tensor:
    allowed = padding_mask(valid_lens, length)[:, 0] & causal_mask(length)  # (B, L, L)
    return ~allowed


def test_einops_mask_checker_accepts_the_inverted_mask():
    assert check_einops_mask(_einops_mask)


def test_einops_mask_checker_refuses_the_library_convention():
    verdict = check_einops_mask(lambda lens, length: ~_einops_mask(lens, length))
    assert not verdict and "invert it" in verdict.message


def test_einops_mask_checker_refuses_padding_alone():
    def padding_only(valid_lens, length):
        return ~padding_mask(valid_lens, length)[:, 0].expand(-1, length, -1)

    assert not check_einops_mask(padding_only)


def test_the_package_exports_the_einops_mask_checker():
    assert mha_lib.exercises.check_einops_mask is check_einops_mask
    assert "check_einops_mask" in mha_lib.exercises.__all__
