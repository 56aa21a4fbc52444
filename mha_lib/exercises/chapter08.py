"""Checkers for chapter 8's exercises (concatenating heads, the full
module)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from mha_lib.exercises.verdict import Verdict, check_calls, close
from mha_lib.heads import merge_heads
from mha_lib.masks import causal_mask, padding_mask
from mha_lib.mha import MultiHeadAttention

__all__ = [
    "check_concat_heads",
    "check_masked_self_attention",
    "check_num_parameters",
]


def check_concat_heads(
    fn: Callable[[list[torch.Tensor]], torch.Tensor],
) -> Verdict:
    """Exercise 8.1: ``fn(heads)`` takes a list of ``H`` per-head outputs,
    each ``(B, L, D)``, and concatenates them into ``(B, L, H*D)`` like
    :func:`merge_heads`."""
    generator = torch.Generator().manual_seed(8)
    for batch, heads, length, head_dim in ((3, 4, 6, 2), (2, 3, 5, 4),
                                           (1, 1, 2, 3)):
        x = torch.randn(batch, heads, length, head_dim,
                        generator=generator)  # (B, H, L, D)
        per_head = list(x.unbind(dim=1))  # H x (B, L, D)
        try:
            given = fn(per_head)
        except Exception as error:
            # the reader's code: report it, do not crash the notebook
            return Verdict(
                False, f"fn({heads} heads of shape "
                       f"{(batch, length, head_dim)}) "
                       f"raised {type(error).__name__}: {error}")
        verdict = close(
            f"fn({heads} heads of shape {(batch, length, head_dim)})",
            given, merge_heads(x), "", atol=0.0, rtol=0.0)
        if not verdict:
            return verdict
    return Verdict(
        True, "head h fills features h*D to (h+1)*D, as in merge_heads")


def check_masked_self_attention(
    mha: MultiHeadAttention, x: torch.Tensor, lengths: torch.Tensor,
    output: torch.Tensor,
) -> Verdict:
    """Exercise 8.2: ``output`` is ``mha``'s self-attention over the padded
    batch ``x`` ``(B, L, d_model)`` where sentence ``b`` has ``lengths[b]``
    real tokens (then pads), no token attends a pad and no token sees its
    future."""
    if not isinstance(mha, MultiHeadAttention):
        return Verdict(
            False, f"mha should be a mha_lib.MultiHeadAttention, "
                   f"got {type(mha).__name__}")
    if (not isinstance(x, torch.Tensor) or x.dim() != 3
            or x.size(-1) != mha.d_model):
        got = (tuple(x.shape) if isinstance(x, torch.Tensor)
               else type(x).__name__)
        return Verdict(
            False, f"x should be the padded batch "
                   f"(B, L, {mha.d_model}), got {got}")
    batch, length = x.shape[:2]
    if (not isinstance(lengths, torch.Tensor)
            or tuple(lengths.shape) != (batch,)):
        got = (tuple(lengths.shape) if isinstance(lengths, torch.Tensor)
               else type(lengths).__name__)
        return Verdict(
            False, f"lengths should be a tensor of shape ({batch},), "
                   f"one length per sentence, got {got}")
    pad = padding_mask(lengths, length)  # (B, 1, 1, Lk)
    causal = causal_mask(length)  # (Lq, Lk)
    with torch.no_grad():
        expected, _ = mha(x, mask=pad & causal)
        only_padding, _ = mha(x, mask=pad)
        only_causal, _ = mha(x, mask=causal)
    if isinstance(output, torch.Tensor) and output.shape == expected.shape:
        given = output.detach()
        if (torch.allclose(given, only_padding, atol=1e-5, rtol=1e-5)
                and not torch.allclose(given, expected,
                                       atol=1e-5, rtol=1e-5)):
            return Verdict(False, "this is the padding mask alone: "
                                  "tokens still see their future")
        if (torch.allclose(given, only_causal, atol=1e-5, rtol=1e-5)
                and not torch.allclose(given, expected,
                                       atol=1e-5, rtol=1e-5)):
            return Verdict(False, "this is the causal mask alone: "
                                  "the pads still attend to pads")
    return close(
        "output", output, expected,
        "padding AND causal: each token sees the real tokens up to itself")


def _num_parameters(d_model: int, num_heads: int, bias: bool) -> int:
    # shapes only: no memory, no use of the random state
    with torch.device("meta"):
        module = MultiHeadAttention(d_model, num_heads, bias=bias)
    return sum(p.numel() for p in module.parameters())


def check_num_parameters(fn: Callable[[int, int, bool], int]) -> Verdict:
    """Exercise 8.3: ``fn(d_model, num_heads, bias)`` is the number of
    parameters of ``MultiHeadAttention(d_model, num_heads, bias=bias)``."""
    cases = ((8, 4, True), (8, 2, True), (512, 8, True), (512, 8, False),
             (768, 12, True), (96, 1, False))
    return check_calls(
        fn, cases, _num_parameters,
        "4 * d_model**2, + 4 * d_model with bias, whatever num_heads")
