"""Checkers for chapter 12's exercises (the transformer block)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from mha_lib.block import TransformerBlock
from mha_lib.exercises.verdict import Verdict, close

__all__ = ["check_block_params", "check_pre_norm"]


def _count(d_model: int, d_ff: int, num_heads: int = 1) -> int:
    block = TransformerBlock(d_model, num_heads, d_ff)
    return sum(p.numel() for p in block.parameters())


def check_block_params(fn: Callable[[int, int], int]) -> Verdict:
    """Exercise 12.1: ``fn(d_model, d_ff)`` is the number of parameters of
    ``TransformerBlock(d_model, num_heads, d_ff)``."""
    for d_model, d_ff in ((8, 32), (6, 10), (12, 48), (1, 1)):
        expected = _count(d_model, d_ff)
        call = f"fn({d_model}, {d_ff})"
        try:
            given = fn(d_model, d_ff)
        except Exception as error:
            # the reader's code: report it, do not crash the notebook
            return Verdict(
                False, f"{call} raised {type(error).__name__}: {error}")
        if given == expected:
            continue
        norms = 4 * d_model
        attention_biases = 4 * d_model
        ffn_biases = d_ff + d_model
        missing = [  # (what a common wrong count leaves out, the hint)
            (norms, "the two LayerNorms have parameters too (gamma and "
                    "beta, d_model each)"),
            (attention_biases, "the four attention projections have "
                               "biases"),
            (ffn_biases, "the two FFN layers have biases"),
            (attention_biases + ffn_biases + norms,
             "count the biases and the LayerNorms' gamma and beta"),
            (2 * d_model * d_model, "attention has four d_model x d_model "
                                    "matrices (Q, K, V and the output)"),
        ]
        found = [h for gap, h in missing if given == expected - gap]
        hint = (" or ".join(found) if found else
                "count attention (4 matrices, 4 biases), the FFN "
                "(2 matrices, 2 biases) and two LayerNorms")
        return Verdict(
            False, f"{call} should be {expected:,}, got {given!r}: {hint}")
    return Verdict(
        True, "4 d^2 + 4 d (attention) + 2 d d_ff + d_ff + d (FFN) + 4 d "
              "(two LayerNorms); the number of heads does not matter")


def check_pre_norm(
    fn: Callable[[TransformerBlock, torch.Tensor], torch.Tensor],
) -> Verdict:
    """Exercise 12.2: ``fn(block, x)`` is the pre-norm forward of a
    :class:`~mha_lib.TransformerBlock` in eval mode, from its parts,
    without a mask: ``(B, L, d_model)`` to ``(B, L, d_model)``."""
    generator = torch.Generator().manual_seed(12)
    cases = ((2, 5, 8, 4, "gelu"), (1, 3, 6, 2, "relu"),
             (3, 1, 4, 1, "gelu"))
    for batch, length, d_model, heads, activation in cases:
        torch.manual_seed(120 + length)
        block = TransformerBlock(d_model, heads, 4 * d_model,
                                 activation=activation).eval()
        with torch.no_grad():  # LayerNorm gains away from 1, biases nonzero
            for norm in (block.norm1, block.norm2):
                norm.weight.uniform_(0.5, 1.5, generator=generator)
                norm.bias.uniform_(-0.5, 0.5, generator=generator)
        x = torch.randn(batch, length, d_model, generator=generator) * 3
        with torch.no_grad():
            expected, _ = block(x)
            try:
                given = fn(block, x)
            except Exception as error:
                # the reader's code: report it, do not crash the notebook
                return Verdict(
                    False, f"fn(block, x of shape {tuple(x.shape)}) raised "
                           f"{type(error).__name__}: {error}")
            if isinstance(given, tuple):
                return Verdict(
                    False, "return the block's output tensor only; "
                           "block.attn(...) returns (output, weights): "
                           "take [0]")
            post = block.norm_first
            block.norm_first = False
            post_norm, _ = block(x)
            block.norm_first = post
        if isinstance(given, torch.Tensor) and given.shape == x.shape:
            if torch.allclose(given, post_norm, atol=1e-5):
                return Verdict(
                    False, "this is post-norm (LayerNorm after the "
                           "residual sum); pre-norm normalises the "
                           "sublayer's input: x + f(norm(x))")
            if torch.allclose(given, expected - x, atol=1e-5):
                return Verdict(
                    False, "the first residual is missing: add the "
                           "block's input x back")
        verdict = close(f"fn(block, x of shape {tuple(x.shape)})", given,
                        expected, "")
        if not verdict:
            return verdict
    return Verdict(
        True, "x + attn(norm1(x)), then + linear2(act(linear1(norm2(x)))):"
              " the residual stream itself is never normalised")
