"""Checkers for chapter 12's exercises (the transformer block)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

from mha_lib.block import TransformerBlock
from mha_lib.exercises.verdict import (
    Verdict,
    attempt,
    catalogue,
    check_calls,
    check_tensor,
)

__all__ = ["check_block_params", "check_pre_norm",
           "check_llama_block_params"]

_BLOCK = "The block: pre-norm and post-norm"
_LLAMA = "Llama's block: RMSNorm and SwiGLU"

PARAMS = catalogue(
    "check_block_params", 12,
    four_d_missing=("4 d_model parameters are missing, and a count cannot "
                    "tell which 4 d_model: check the four attention "
                    "biases (q, k, v and out, d_model each) and the two "
                    "LayerNorms' gamma and beta (d_model each)",
                    "LayerNorm"),
    ffn_biases=("the two FFN layers have biases: d_ff and d_model",
                "The feed-forward network"),
    biases_and_norms=("count the biases and the LayerNorms' gamma and "
                      "beta", "LayerNorm"),
    two_attention_matrices=("attention has four d_model x d_model "
                            "matrices (Q, K, V and the output)",
                            "The output projection", 8),
    one_norm=("2 d_model parameters are missing: there are two "
              "LayerNorms, one for each sublayer, and each has gamma "
              "and beta, d_model each (leaving out one LayerNorm and "
              "leaving out both betas give this same count)", "LayerNorm"),
    no_biases=("the biases are missing: d_model for each of the four "
               "attention layers, d_ff and d_model for the two FFN layers",
               "The feed-forward network"),
    no_output_projection=("the output projection W_o is missing: a "
                          "d_model x d_model matrix and its d_model "
                          "biases", "The output projection", 8),
    four_d_model=("this counts the FFN with 4 d_model hidden units: use "
                  "d_ff, the argument (4 d_model is only the usual "
                  "choice)", "The feed-forward network"),
    ffn_bias_sizes=("the FFN's biases are miscounted: each layer has one "
                    "bias per output, d_ff for linear1 (d_model -> d_ff) "
                    "and d_model for linear2 (d_ff -> d_model)",
                    "The feed-forward network"),
    one_ffn_matrix=("the FFN has two weight matrices, d_model x d_ff "
                    "(linear1) and d_ff x d_model (linear2): 2 d_model "
                    "d_ff weights, plus the biases d_ff and d_model",
                    "The feed-forward network"),
)


def _count(d_model: int, d_ff: int, num_heads: int = 1) -> int:
    with torch.random.fork_rng():  # leave the reader's random state alone
        block = TransformerBlock(d_model, num_heads, d_ff)
    return sum(p.numel() for p in block.parameters())


def _wrong_counts(d: int, d_ff: int) -> list:
    right = _count(d, d_ff)
    return [(PARAMS["four_d_missing"], right - 4 * d),
            (PARAMS["ffn_biases"], right - d_ff - d),
            (PARAMS["biases_and_norms"], right - 8 * d - d_ff - d),
            (PARAMS["two_attention_matrices"], right - 2 * d * d),
            (PARAMS["one_norm"], right - 2 * d),
            (PARAMS["no_biases"], right - 5 * d - d_ff),
            (PARAMS["no_output_projection"], right - d * d - d),
            (PARAMS["four_d_model"], _count(d, 4 * d)),
            (PARAMS["ffn_bias_sizes"], right + d_ff - d),  # 2 d_ff
            (PARAMS["ffn_bias_sizes"], right - d_ff + d),  # 2 d_model
            (PARAMS["one_ffn_matrix"], right - d * d_ff - d),  # one layer
            (PARAMS["one_ffn_matrix"], right - d * d_ff)]  # both biases


def check_block_params(fn: Callable[[int, int], int]) -> Verdict:
    """Exercise 12.1: ``fn(d_model, d_ff)`` is the number of parameters of
    ``TransformerBlock(d_model, num_heads, d_ff)``."""
    return check_calls(
        # (6, 10) first: at (8, 32) forgetting every bias and forgetting
        # W_o both give 800, and the hint could not tell them apart.
        fn, ((6, 10), (8, 32), (12, 48), (1, 1)), _count,
        "4 d^2 + 4 d (attention) + 2 d d_ff + d_ff + d (FFN) + 4 d "
        "(two LayerNorms); the number of heads does not matter",
        mistakes=_wrong_counts)


LLAMA = catalogue(
    "check_llama_block_params", 12,
    no_gate=("the gate is missing: SwiGLU has three d_model x d_ff "
             "matrices, W1 and the gate W3 (d_model -> d_ff) and W2 "
             "(d_ff -> d_model), 3 d_model d_ff weights", _LLAMA),
    four_d_model=("this counts the FFN with 4 d_model hidden units: use "
                  "d_ff, the argument, and SwiGLU's three matrices (the "
                  "counts agree only where d_ff = 8/3 d_model)", _LLAMA),
    attention_biases=("Llama's attention has no biases: its four "
                      "d_model x d_model matrices only", _LLAMA),
    ffn_biases=("Llama's FFN has no biases: three matrices, 3 d_model "
                "d_ff weights", _LLAMA),
    all_biases=("Llama's linear layers have no biases, in attention or "
                "in the FFN: count the matrices only", _LLAMA),
    norm_betas=("RMSNorm has a gain gamma only, no beta: d_model "
                "parameters for each of the two norms", _LLAMA),
    no_norms=("the two RMSNorms are missing: each has a gain gamma of "
              "d_model parameters", _LLAMA),
    transformer_block=("this is the count of Exercise 12.1's "
                       "TransformerBlock (biases, two FFN matrices, "
                       "LayerNorms with beta); Llama's block has no "
                       "biases, three FFN matrices and RMSNorms",
                       _LLAMA),
)


def _llama_count(d: int, d_ff: int) -> int:
    return 4 * d * d + 3 * d * d_ff + 2 * d


def _wrong_llama_counts(d: int, d_ff: int) -> list:
    right = _llama_count(d, d_ff)
    return [(LLAMA["no_gate"], right - d * d_ff),
            (LLAMA["no_gate"], right - d * d_ff + d_ff + d),  # + biases
            (LLAMA["four_d_model"], _llama_count(d, 4 * d)),
            (LLAMA["four_d_model"], right - 3 * d * d_ff + 8 * d * d),
            (LLAMA["attention_biases"], right + 4 * d),
            (LLAMA["ffn_biases"], right + 2 * d_ff + d),
            (LLAMA["all_biases"], right + 4 * d + 2 * d_ff + d),
            (LLAMA["norm_betas"], right + 2 * d),
            (LLAMA["no_norms"], right - 2 * d),
            (LLAMA["transformer_block"], _count(d, d_ff))]


def check_llama_block_params(fn: Callable[[int, int], int]) -> Verdict:
    """Exercise 12.4: ``fn(d_model, d_ff)`` is the number of parameters of
    a Llama block: attention without biases (4 d_model^2), the SwiGLU
    FFN (3 d_model d_ff) and two RMSNorms (d_model each)."""
    return check_calls(
        fn, ((6, 16), (8, 24), (12, 32), (1, 3)), _llama_count,
        "4 d^2 (attention, no biases) + 3 d d_ff (SwiGLU: W1, the gate "
        "W3, W2) + 2 d (two RMSNorms, gamma only)",
        mistakes=_wrong_llama_counts)


PRE_NORM = catalogue(
    "check_pre_norm", 12,
    post_norm=("this is post-norm (LayerNorm after the residual sum); "
               "pre-norm normalises the sublayer's input: x + f(norm(x))",
               _BLOCK),
    normalised_stream=("this normalises the residual stream itself "
                       "(x = norm1(x), then x + attn(x)): pre-norm adds "
                       "f(norm(x)) to the x that was not normalised",
                       _BLOCK),
    no_first_residual=("the first residual is missing: add the block's "
                       "input x back to the attention output",
                       "Residual connections"),
    no_second_residual=("the second residual is missing: add the FFN's "
                        "output to its input, h + ffn(norm2(h))",
                        "Residual connections"),
    one_norm=("both sublayers use norm1: the FFN's input goes through "
              "norm2", _BLOCK),
    swapped_norms=("norm1 and norm2 are swapped: norm1 feeds attention, "
                   "norm2 the FFN", _BLOCK),
    raw_key_value=("attention gets norm1(x) as the query only: the keys "
                   "and values must be normalised too, attn(norm1(x))",
                   _BLOCK),
    no_activation=("the activation between the two FFN layers is "
                   "missing", "The feed-forward network"),
    pair=("return the block's output tensor only; block.attn(...) "
          "returns (output, weights): take [0]", _BLOCK),
    whole_block=("that calls the block itself; the exercise writes the "
                 "forward from its parts", _BLOCK),
    pair_sum=("block.attn(...) returns a pair (output, weights): take "
              "[0] before adding it to x", _BLOCK),
    fixed_relu=("this uses ReLU: the block's activation is "
                "block.activation (GELU by default)",
                "The feed-forward network"),
    final_norm=("the block's output is normalised once more: GPT-2's "
                "final LayerNorm follows the whole stack, not each block",
                _BLOCK),
    no_residual=("both residuals are missing: add each sublayer's output "
                 "to its input, h = x + attn(norm1(x)), then "
                 "h + ffn(norm2(h))", "Residual connections"),
    stale_ffn_input=("the FFN reads norm2(x), the block's input: it reads "
                     "the stream after attention's update, "
                     "h = x + attn(norm1(x)), then h + ffn(norm2(h))",
                     _BLOCK),
    parallel=("this is the parallel form (GPT-J's): attention and the "
              "FFN both read norm1(x). The block is sequential: "
              "h = x + attn(norm1(x)), then h + ffn(norm2(h))", _BLOCK),
    swapped_order=("the sublayers run in the wrong order (the FFN first): "
                   "attention comes first, h = x + attn(norm1(x)), then "
                   "the FFN, h + ffn(norm2(h))", _BLOCK),
    causal_mask=("this applies a causal mask (is_causal=True or a mask): "
                 "the exercise's forward has none, every token attends "
                 "to every token", _BLOCK),
    output_norm=("this normalises each sublayer's output, x + "
                 "norm1(attn(x)): pre-norm normalises its input, "
                 "x + attn(norm1(x)), then h + ffn(norm2(h))", _BLOCK),
    attn_output_ffn=("the FFN reads norm2 of attention's output alone: "
                     "it reads the updated stream, h = x + "
                     "attn(norm1(x)), then h + ffn(norm2(h))", _BLOCK),
)


def _explain(error: BaseException, _: object) -> object:
    """The hint for ``x + block.attn(...)`` without ``[0]``."""
    if isinstance(error, TypeError) and "tuple" in str(error):
        return PRE_NORM["pair_sum"]
    return None


def _seen(called: list, *_: object) -> None:
    called.append(True)  # the block itself was called


def _wrong_forward(block: TransformerBlock, x: torch.Tensor,
                   how: str) -> torch.Tensor:
    """The output of a usual wrong pre-norm forward."""
    def attn(q, kv=None):
        return block.attn(q, kv, kv, need_weights=False)[0]

    def ffn(h, act=True):
        hidden = block.linear1(h)
        return block.linear2(block.activation(hidden) if act else hidden)

    n1, n2 = block.norm1, block.norm2
    with torch.no_grad():
        if how == "causal_mask":
            h = x + block.attn(n1(x), need_weights=False, is_causal=True)[0]
            return h + ffn(n2(h))
        if how == "attn_output_ffn":
            a = attn(n1(x))
            return x + a + ffn(n2(a))
        if how == "output_norm":  # Gemma's output norm, no input norm
            h = x + n1(attn(x))
            return h + n2(ffn(h))
        if how == "post_norm":
            h = n1(x + attn(x))
            return n2(h + ffn(h))
        if how == "normalised_stream":
            h = n1(x)
            h = h + attn(h)
            h = n2(h)
            return h + ffn(h)
        if how == "no_residual":
            return ffn(n2(attn(n1(x))))
        if how == "no_first_residual":
            h = attn(n1(x))
            return h + ffn(n2(h))
        if how in ("swapped_order", "swapped_order2"):  # the FFN first
            first, second = (n2, n1) if how == "swapped_order" else (n1, n2)
            h = x + ffn(first(x))
            return h + attn(second(h))
        h = x + attn(n1(x), x if how == "raw_key_value" else None)
        if how == "no_second_residual":
            return ffn(n2(h))
        if how == "one_norm":
            return h + ffn(n1(h))
        if how == "swapped_norms":
            h = x + attn(n2(x))
            return h + ffn(n1(h))
        if how in ("stale_ffn_input", "parallel"):
            return h + ffn((n2 if how == "stale_ffn_input" else n1)(x))
        if how == "fixed_relu":
            return h + block.linear2(F.relu(block.linear1(n2(h))))
        out = h + ffn(n2(h), act=how != "no_activation")
        if how == "final_norm":  # a fresh LayerNorm, or norm2 once more
            return F.layer_norm(out, out.shape[-1:])
        if how == "final_norm2":
            return n2(out)
        return out


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
        with torch.random.fork_rng():  # leave the reader's state alone
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
            called: list = []
            hook = block.register_forward_pre_hook(partial(_seen, called))
            try:
                call = attempt(fn, block, x, explain=_explain)
            finally:
                hook.remove()
        if call.verdict is not None:
            return call.verdict
        if called:
            return PRE_NORM["whole_block"].verdict(call.label)
        if isinstance(call.value, tuple):
            return PRE_NORM["pair"].verdict(call.label)
        problem = check_tensor(
            call.label, call.value, expected, axes="(B, L, d_model)",
            mistakes=[(PRE_NORM[how.rstrip("2")],
                       partial(_wrong_forward, block, x, how))
                      for how in (
                    "post_norm", "normalised_stream", "no_residual",
                    "no_first_residual", "stale_ffn_input", "parallel",
                    "no_second_residual", "one_norm", "swapped_norms",
                    "raw_key_value", "swapped_order", "swapped_order2",
                    "no_activation", "fixed_relu", "final_norm",
                    "final_norm2", "causal_mask", "attn_output_ffn",
                    "output_norm")])
        if problem is not None:
            return problem
    return Verdict(
        True, "x + attn(norm1(x)), then + linear2(act(linear1(norm2(x)))):"
              " the residual stream itself is never normalised")
