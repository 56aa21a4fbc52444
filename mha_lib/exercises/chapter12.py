"""Checkers for chapter 12's exercises (the transformer block)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from mha_lib.block import TransformerBlock
from mha_lib.exercises.verdict import (
    Verdict,
    attempt,
    calls_to,
    catalogue,
    check_calls,
    check_tensor,
)
from mha_lib.masks import causal_mask
from mha_lib.mha import MultiHeadAttention

__all__ = ["check_block_params", "check_pre_norm", "check_llama_block",
           "check_parallel_block", "check_llama_block_params", "LlamaParts"]

_BLOCK = "The block: pre-norm and post-norm"
_LLAMA = "Llama's block: RMSNorm and SwiGLU"

PARAMS = catalogue(
    "check_block_params", 12,
    four_d_missing=("4 d_model parameters are missing, and a count cannot "
                    "tell which 4 d_model: check the four attention "
                    "biases (q, k, v and out, d_model each, counted in "
                    "chapter 8's Exercise 8.3) and the two LayerNorms' "
                    "gamma and beta (d_model each)",
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
    three_norms=("2 d_model too many: one LayerNorm too many. A block "
                 "has two, one for each sublayer; the final LayerNorm "
                 "of a pre-norm stack follows the whole stack (count it "
                 "once for the model), not each block", "LayerNorm"),
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
    num_heads_argument=("block_params takes (d_model, d_ff), two "
                        "arguments: no num_heads, which does not change "
                        "the count (the heads split the same matrices)",
                        "The output projection", 8),
    twelve_d_squared=("12 d_model^2 is the textbook count: weights only, "
                      "with d_ff = 4 d_model. Use d_ff, the argument "
                      "(2 d_model d_ff FFN weights), and count the "
                      "biases and the LayerNorms' gamma and beta",
                      "The feed-forward network"),
    one_bias=("d_model parameters are missing: one bias vector of "
              "d_model (the output projection's, another attention "
              "bias, or linear2's) or one LayerNorm's beta",
              "LayerNorm"),
    attention_biases_twice=("4 d_model too many: are the four attention "
                            "biases counted twice, once with their "
                            "matrices (4 d^2 + 4 d) and once more on "
                            "their own? (Four LayerNorms for the block's "
                            "two give the same count.)",
                            "The output projection", 8),
    biases_twice=("5 d_model + d_ff too many: every bias is counted "
                  "twice. The six biases, 4 d_model in attention and "
                  "d_ff + d_model in the FFN, belong in the count once",
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
            (PARAMS["three_norms"], right + 2 * d),
            (PARAMS["no_biases"], right - 5 * d - d_ff),
            (PARAMS["no_output_projection"], right - d * d - d),
            (PARAMS["four_d_model"], _count(d, 4 * d)),
            (PARAMS["ffn_bias_sizes"], right + d_ff - d),  # 2 d_ff
            (PARAMS["ffn_bias_sizes"], right - d_ff + d),  # 2 d_model
            (PARAMS["one_ffn_matrix"], right - d * d_ff - d),  # one layer
            (PARAMS["one_ffn_matrix"], right - d * d_ff),  # both biases
            (PARAMS["twelve_d_squared"], 12 * d * d),
            (PARAMS["one_bias"], right - d),
            (PARAMS["attention_biases_twice"], right + 4 * d),
            (PARAMS["biases_twice"], right + 5 * d + d_ff)]


def _three_arguments(fn: Callable) -> bool:
    """``fn`` takes three required arguments (TransformerBlock's
    ``d_model, num_heads, d_ff``) where the exercise passes two."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # no signature to read
        return False
    return sum(p.default is p.empty and p.kind in (
        p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params) == 3


def check_block_params(fn: Callable[[int, int], int]) -> Verdict:
    """Exercise 12.1: ``fn(d_model, d_ff)`` is the number of parameters of
    ``TransformerBlock(d_model, num_heads, d_ff)``."""
    if _three_arguments(fn):
        return PARAMS["num_heads_argument"].verdict(
            f"{getattr(fn, '__name__', 'fn')}(d_model, num_heads, d_ff)")
    return check_calls(
        # (6, 10) first: at (8, 32) forgetting every bias and forgetting
        # W_o both give 800, and the hint could not tell them apart.
        fn, ((6, 10), (8, 32), (12, 48), (1, 1)), _count,
        "4 d^2 + 4 d (attention) + 2 d d_ff + d_ff + d (FFN) + 4 d "
        "(two LayerNorms); the number of heads does not matter",
        mistakes=_wrong_counts)


LLAMA = catalogue(
    "check_llama_block_params", 12,
    no_gate=("a d_model x d_ff matrix is missing: SwiGLU has three, "
             "the gate W1 and the up projection W3 (d_model -> d_ff) and "
             "W2 (d_ff -> d_model), 3 d_model d_ff weights", _LLAMA),
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
    one_rms_norm=("d_model parameters are missing: a Llama block has "
                  "two RMSNorms, one before each sublayer, d_model "
                  "each", _LLAMA),
    final_norm=("one d_model too many: the final RMSNorm follows the "
                "whole stack (count it once for the model), not each "
                "block", _LLAMA),
    two_attention_matrices=("attention has four d_model x d_model "
                            "matrices (Q, K, V and the output); in "
                            "Llama 7B every head has its own keys and "
                            "values, none shared as in grouped-query "
                            "attention", _LLAMA),
    carried_over=("this carries Exercise 12.1's biases and LayerNorm "
                  "betas over: Llama's linear layers have no biases "
                  "(attention or FFN) and its RMSNorms have a gain gamma "
                  "only, d_model each: 4 d^2 + 3 d d_ff + 2 d", _LLAMA),
    transformer_block=("this is the count of Exercise 12.1's "
                       "TransformerBlock (biases, two FFN matrices, "
                       "LayerNorms with beta); Llama's block has no "
                       "biases, three FFN matrices and RMSNorms",
                       _LLAMA),
    num_heads_argument=("llama_block_params takes (d_model, d_ff), two "
                        "arguments: no num_heads, which does not change "
                        "the count (the heads split the same four "
                        "matrices)", _LLAMA),
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
            # 12.1's biases as they were: attention 4 d, FFN d_ff + d
            (LLAMA["all_biases"], right + 4 * d + d_ff + d),
            (LLAMA["norm_betas"], right + 2 * d),
            (LLAMA["no_norms"], right - 2 * d),
            (LLAMA["one_rms_norm"], right - d),
            (LLAMA["final_norm"], right + d),
            (LLAMA["two_attention_matrices"], right - 2 * d * d),
            # 12.1's biases (SwiGLU's three layers, or 12.1's d_ff + d)
            # and the LayerNorms' betas, carried into the Llama count
            (LLAMA["carried_over"], right + 4 * d + 2 * d_ff + d + 2 * d),
            (LLAMA["carried_over"], right + 4 * d + d_ff + d + 2 * d),
            (LLAMA["transformer_block"], _count(d, d_ff))]


def check_llama_block_params(fn: Callable[[int, int], int]) -> Verdict:
    """Exercise 12.4: ``fn(d_model, d_ff)`` is the number of parameters of
    a Llama block: attention without biases (4 d_model^2), the SwiGLU
    FFN (3 d_model d_ff) and two RMSNorms (d_model each)."""
    if _three_arguments(fn):
        return LLAMA["num_heads_argument"].verdict(
            f"{getattr(fn, '__name__', 'fn')}(d_model, num_heads, d_ff)")
    return check_calls(
        fn, ((6, 16), (8, 24), (12, 32), (1, 3)), _llama_count,
        "4 d^2 (attention, no biases) + 3 d d_ff (SwiGLU: the gate W1, "
        "W3 and W2) + 2 d (two RMSNorms, gamma only)",
        mistakes=_wrong_llama_counts)


PRE_NORM = catalogue(
    "check_pre_norm", 12,
    post_norm=("this is post-norm (LayerNorm after the residual sum); "
               "pre-norm normalises the sublayer's input: x + f(norm(x))",
               _BLOCK),
    normalised_stream=("this normalises the residual stream itself, "
                       "norm(x) + f(norm(x)): pre-norm adds f(norm(x)) "
                       "to the x that was not normalised, x + "
                       "attn(norm1(x)), then h + ffn(norm2(h))", _BLOCK),
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
    ffn_to_x=("the FFN's update is added to x, the block's input, which "
              "drops attention's update: add it to h, h = x + "
              "attn(norm1(x)), then h + ffn(norm2(h))",
              "Residual connections"),
    final_norm=("the block's output is normalised once more: GPT-2's "
                "final LayerNorm follows the whole stack, not each block",
                _BLOCK),
    no_residual=("both residuals are missing: add each sublayer's output "
                 "to its input, h = x + attn(norm1(x)), then "
                 "h + ffn(norm2(h))", "Residual connections"),
    stale_ffn_input=("the FFN reads norm2(x), the block's input "
                     "(a parallel block with a norm per sublayer, as in "
                     "GPT-NeoX; GPT-J's shares one): the "
                     "sequential "
                     "block's FFN reads the stream after attention's "
                     "update, h = x + attn(norm1(x)), then "
                     "h + ffn(norm2(h))", _BLOCK),
    parallel=("this is the parallel form (GPT-J's): attention and the "
              "FFN both read norm1(x). The block is sequential: "
              "h = x + attn(norm1(x)), then h + ffn(norm2(h))", _BLOCK),
    swapped_order=("the sublayers run in the wrong order (the FFN first): "
                   "attention comes first, h = x + attn(norm1(x)), then "
                   "the FFN, h + ffn(norm2(h))", _BLOCK),
    causal_mask=("this applies a causal mask (is_causal=True or a mask): "
                 "the block checked has none (it is not causal), every "
                 "token attends to every token", _BLOCK),
    output_norm=("this normalises each sublayer's output, x + "
                 "norm1(attn(x)): pre-norm normalises its input, "
                 "x + attn(norm1(x)), then h + ffn(norm2(h))", _BLOCK),
    attn_output_ffn=("the FFN reads norm2 of attention's output alone: "
                     "it reads the updated stream, h = x + "
                     "attn(norm1(x)), then h + ffn(norm2(h))", _BLOCK),
    fixed_gelu=("this uses GELU: the block's activation is "
                "block.activation, GELU by default but ReLU in this "
                "block", "The feed-forward network"),
    fresh_norm=("this normalises without the block's learned gamma and "
                "beta (F.layer_norm or a fresh nn.LayerNorm): use "
                "block.norm1 and block.norm2", "LayerNorm"),
    in_place=("this changes the caller's x in place (x += ...): write "
              "x = x + ...; in training the in-place add also breaks "
              "autograd, which needs the input that was overwritten",
              "Residual connections"),
    mask_ignored=("with a mask (its third argument) this gives the "
                  "output without one: pass the mask on to attention, "
                  "block.attn(h, mask=mask, need_weights=False)", _BLOCK),
    no_mask_argument=("right without a mask, but the function takes no "
                      "mask: write pre_norm(block, x, mask=None) and pass "
                      "the mask on to attention, block.attn(h, mask=mask, "
                      "need_weights=False); a block that drops its mask "
                      "lets a decoder's tokens see the future", _BLOCK),
    inverted_mask=("with a mask (its third argument) this gives the "
                   "output of the inverted mask, ~mask: the book's masks "
                   "are True = may attend, so pass the mask on as it is "
                   "(only PyTorch's own layers take True = blocked)",
                   _BLOCK),
)


def _takes_mask(fn: Callable) -> bool:
    """``fn``'s third argument is a mask, as in the page's
    ``pre_norm(block, x, mask=None)``: named ``mask`` or None by
    default."""
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):  # no signature to read
        return False
    return len(params) >= 3 and (
        "mask" in params[2].name or params[2].default is None)


def _check_masked(fn: Callable, block: TransformerBlock, x: torch.Tensor,
                  mask: torch.Tensor) -> Verdict | None:
    """``fn(block, x, mask)`` against the block with ``mask``."""
    with torch.no_grad():
        expected, _ = block(x, mask=mask)
        unmasked, _ = block(x)
        inverted, _ = block(x, mask=~mask)
        call = attempt(fn, block, x.clone(), mask, explain=_explain)
    if call.verdict is not None:
        return call.verdict
    if isinstance(call.value, tuple):
        return PRE_NORM["pair"].verdict(call.label)
    return check_tensor(
        call.label, call.value, expected, axes="(B, L, d_model)",
        mistakes=[(PRE_NORM["mask_ignored"], unmasked),
                  (PRE_NORM["inverted_mask"], inverted)])


def _explain(error: BaseException, _: object) -> object:
    """The hint for ``x + block.attn(...)`` without ``[0]``."""
    if isinstance(error, TypeError) and "tuple" in str(error):
        return PRE_NORM["pair_sum"]
    return None


# Wrong wirings of a pre-norm residual block that both of this chapter's
# block checkers plant, in terms of its two sublayers and two norms.
_MISWIRED = {"post_norm", "normalised_stream", "normalised_stream1",
             "normalised_stream2", "no_residual", "no_first_residual",
             "no_second_residual", "one_norm", "swapped_norms",
             "stale_ffn_input", "parallel", "ffn_to_x"}


def _miswired(how: str, x: torch.Tensor, attn: Callable, ffn: Callable,
              n1: Callable, n2: Callable) -> torch.Tensor:
    """The output of the wrong wiring ``how`` (one of ``_MISWIRED``) of the
    block ``x + attn(n1(x))``, then ``h + ffn(n2(h))``."""
    if how == "post_norm":
        h = n1(x + attn(x))
        return n2(h + ffn(h))
    if how.startswith("normalised_stream"):  # 1, 2: one sublayer only
        h = n1(x) if how != "normalised_stream2" else x
        h = h + attn(n1(x))
        z = n2(h)
        return (z if how != "normalised_stream1" else h) + ffn(z)
    if how == "swapped_norms":
        h = x + attn(n2(x))
        return h + ffn(n1(h))
    if how == "no_residual":
        return ffn(n2(attn(n1(x))))
    if how == "ffn_to_x":  # attention's update dropped
        return x + ffn(n2(x + attn(n1(x))))
    h = attn(n1(x)) if how == "no_first_residual" else x + attn(n1(x))
    if how == "no_second_residual":
        return ffn(n2(h))
    if how == "one_norm":
        return h + ffn(n1(h))
    if how in ("stale_ffn_input", "parallel"):
        return h + ffn((n2 if how == "stale_ffn_input" else n1)(x))
    return h + ffn(n2(h))  # no_first_residual


def _wrong_forward(block: TransformerBlock, x: torch.Tensor,
                   how: str) -> torch.Tensor:
    """The output of a usual wrong pre-norm forward."""
    def attn(q, kv=None):
        return block.attn(q, kv, kv, need_weights=False)[0]

    def ffn(h, act=True):
        hidden = block.linear1(h)
        return block.linear2(block.activation(hidden) if act else hidden)

    n1, n2 = block.norm1, block.norm2
    if how.startswith("fresh_norm"):  # LayerNorm without gamma and beta
        def fresh(h):
            return F.layer_norm(h, h.shape[-1:])
        n1 = fresh if how != "fresh_norm2" else n1
        n2 = fresh if how != "fresh_norm1" else n2
        how = "right"
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
        if how in _MISWIRED:
            return _miswired(how, x, attn, ffn, n1, n2)
        if how in ("swapped_order", "swapped_order2"):  # the FFN first
            first, second = (n2, n1) if how == "swapped_order" else (n1, n2)
            h = x + ffn(first(x))
            return h + attn(second(h))
        h = x + attn(n1(x), x if how == "raw_key_value" else None)
        if how in ("fixed_relu", "fixed_gelu"):
            act = F.relu if how == "fixed_relu" else F.gelu
            return h + block.linear2(act(block.linear1(n2(h))))
        out = h + ffn(n2(h), act=how != "no_activation")
        if how == "final_norm":  # a fresh LayerNorm, or norm2 once more
            return F.layer_norm(out, out.shape[-1:])
        if how in ("final_norm1", "final_norm2"):  # a block norm again
            return (n1 if how == "final_norm1" else n2)(out)
        return out


def _test_block(d_model: int, heads: int, seed: int,
                generator: torch.Generator,
                activation: str = "gelu") -> TransformerBlock:
    """A block in eval mode whose weights come from ``seed`` (the reader's
    random state left alone), with LayerNorm gains away from 1 and nonzero
    biases drawn from ``generator``, so that a norm left out shows."""
    with torch.random.fork_rng():  # leave the reader's state alone
        torch.manual_seed(seed)
        block = TransformerBlock(d_model, heads, 4 * d_model,
                                 activation=activation).eval()
    with torch.no_grad():
        for norm in (block.norm1, block.norm2):
            norm.weight.uniform_(0.5, 1.5, generator=generator)
            norm.bias.uniform_(-0.5, 0.5, generator=generator)
    return block


def _run_on_block(fn, block, x, explain, named, pair):
    """Calls ``fn(block, x)`` on a copy of ``x`` without gradients and
    returns ``(call, refusal)``: the refusal (or None) when ``fn`` failed,
    called the block itself, changed ``x`` in place (``named``'s
    "whole_block" and "in_place" hints) or returned a pair
    (``pair(label)``)."""
    given = x.clone()  # the reader's function must leave x alone
    with torch.no_grad(), calls_to(block) as called:  # the block called
        call = attempt(fn, block, given, explain=explain)
    if call.verdict is not None:
        return call, call.verdict
    if called:
        return call, named["whole_block"].verdict(call.label)
    if not torch.equal(given, x):
        return call, named["in_place"].verdict(call.label)
    if isinstance(call.value, tuple):
        return call, pair(call.label)
    return call, None


def check_pre_norm(
    fn: Callable[[TransformerBlock, torch.Tensor], torch.Tensor],
) -> Verdict:
    """``fn(block, x, mask=None)`` is the pre-norm forward of a
    :class:`~mha_lib.TransformerBlock` in eval mode, from its parts:
    ``(B, L, d_model)`` to ``(B, L, d_model)``, checked without a mask and
    with a padding mask ``(B, 1, 1, L)``; a right forward that takes no
    mask is ``Not yet``."""
    generator = torch.Generator().manual_seed(12)
    cases = ((2, 5, 8, 4, "gelu"), (1, 3, 6, 2, "relu"),
             (3, 1, 4, 1, "gelu"))
    for batch, length, d_model, heads, activation in cases:
        block = _test_block(d_model, heads, 120 + length, generator,
                            activation)
        x = torch.randn(batch, length, d_model, generator=generator) * 3
        with torch.no_grad():
            expected, _ = block(x)
        call, refusal = _run_on_block(fn, block, x, _explain, PRE_NORM,
                                      PRE_NORM["pair"].verdict)
        if refusal is not None:
            return refusal
        problem = check_tensor(
            call.label, call.value, expected, axes="(B, L, d_model)",
            mistakes=[(PRE_NORM[how.rstrip("12")],
                       partial(_wrong_forward, block, x, how))
                      for how in (
                    "post_norm", "normalised_stream", "no_residual",
                    "no_first_residual", "stale_ffn_input", "parallel",
                    "no_second_residual", "one_norm", "swapped_norms",
                    "raw_key_value", "swapped_order", "swapped_order2",
                    "no_activation", "fixed_relu", "final_norm",
                    "final_norm1", "final_norm2", "normalised_stream1",
                    "normalised_stream2", "causal_mask", "attn_output_ffn",
                    "output_norm", "fixed_gelu", "fresh_norm",
                    "fresh_norm1", "fresh_norm2", "ffn_to_x")])
        if problem is not None:
            return problem
        masked = _takes_mask(fn)
        if length > 1 and masked:  # with a padding mask too
            mask = torch.ones(batch, 1, 1, length, dtype=torch.bool)
            # True = may attend; padding in every sequence, so that the
            # inverted mask leaves every query a key
            mask[..., length // 2 + 1:] = False
            problem = _check_masked(fn, block, x, mask)
            if problem is not None:
                return problem
    if not masked:
        return PRE_NORM["no_mask_argument"].verdict(call.label)
    return Verdict(
        True, "h = x + attn(norm1(x)), then "
              "h + linear2(act(linear1(norm2(h)))): the residual stream "
              "itself is never normalised (checked with a padding mask "
              "too)")


LLAMA_BLOCK = catalogue(
    "check_llama_block", 12,
    post_norm=("this is post-norm (the norm after the residual sum); "
               "Llama is pre-norm: h = x + attn(norm1(x)), then "
               "h + swiglu(norm2(h))", _BLOCK),
    normalised_stream=("this normalises the residual stream itself, "
                       "norm(x) + f(norm(x)): Llama adds attn(norm1(x)) "
                       "to the x that was not normalised, then "
                       "h + swiglu(norm2(h)) to the h that was not",
                       _BLOCK),
    final_norm=("the block's output is normalised once more: the final "
                "RMSNorm follows the whole stack, not each block",
                _BLOCK),
    one_norm=("both sublayers use norm1: each has its own RMSNorm, "
              "norm2 (its own gamma) before the FFN", _BLOCK),
    swapped_norms=("norm1 and norm2 are swapped: norm1 feeds attention, "
                   "norm2 the FFN (each has its own gamma)", _BLOCK),
    stale_ffn_input=("the FFN reads norm2(x), the block's input "
                     "(a parallel block with a norm per sublayer, as in "
                     "GPT-NeoX; GPT-J's shares one): Llama's "
                     "FFN reads the "
                     "stream after "
                     "attention's update, h = x + attn(norm1(x)), then "
                     "h + swiglu(norm2(h))", _BLOCK),
    parallel=("this is GPT-J's parallel block, x + attn(norm1(x)) + "
              "swiglu(norm1(x)): Llama's is sequential, h = x + "
              "attn(norm1(x)), then h + swiglu(norm2(h))", _BLOCK),
    no_first_residual=("the first residual is missing: add the block's "
                       "input x back to the attention output",
                       "Residual connections"),
    no_second_residual=("the second residual is missing: h + "
                        "swiglu(norm2(h))", "Residual connections"),
    ffn_to_x=("the FFN's update is added to x, the block's input, which "
              "drops attention's update: add it to h, h = x + "
              "attn(norm1(x)), then h + swiglu(norm2(h))",
              "Residual connections"),
    no_residual=("both residuals are missing: add each sublayer's output "
                 "to its input, h = x + attn(norm1(x)), then "
                 "h + swiglu(norm2(h))", "Residual connections"),
    raw_ffn_input=("the FFN reads the raw stream h: norm2 is missing, "
              "h + swiglu(norm2(h))", _BLOCK),
    swapped_order=("the sublayers run in the wrong order (the FFN "
                   "first): attention comes first", _BLOCK),
    layer_norm=("this subtracts the mean (LayerNorm): RMSNorm divides by "
                "the root mean square only, gamma * x / sqrt(mean(x^2) "
                "+ eps)", _LLAMA),
    layer_norm_no_gain=("this is F.layer_norm without the gain: "
                        "it subtracts the mean and drops gamma. Use "
                        "p.norm1 and p.norm2, RMSNorms with "
                        "their gamma, gamma * x / sqrt(mean(x^2) + eps)",
                        _LLAMA),
    no_gain=("the norms' gain gamma is missing: use p.norm1 and "
             "p.norm2 (or rms_norm(h, p.norm1.weight))", _LLAMA),
    gate_swapped=("SiLU is on w3: it goes on w1, the gate (HF's "
                  "gate_proj), silu(w1(z)) * w3(z); w3 (HF's up_proj) "
                  "stays linear", _LLAMA),
    no_gate=("the product is missing: SwiGLU multiplies the gate "
             "silu(w1(z)) by w3(z) before w2", _LLAMA),
    no_silu=("the SiLU is missing: w2(silu(w1(z)) * w3(z)), not "
             "w2(w1(z) * w3(z))", _LLAMA),
    silu_of_product=("the SiLU is on the product: it goes on w1(z) "
                     "alone, which makes it the gate, "
                     "silu(w1(z)) * w3(z), not silu(w1(z) * w3(z))",
                     _LLAMA),
    gelu=("this uses GELU: SwiGLU's activation is SiLU, z * sigmoid(z) "
          "(F.silu)", _LLAMA),
    sigmoid=("this uses the sigmoid alone: SiLU is z * sigmoid(z) "
             "(F.silu), silu(w1(z)) * w3(z)", _LLAMA),
    relu=("this uses ReLU (ReGLU): SwiGLU's activation is SiLU, "
          "z * sigmoid(z) (F.silu), silu(w1(z)) * w3(z)", _LLAMA),
    no_mask=("this attention has no causal mask: Llama is a decoder, "
             "each token attends to itself and the tokens before it, "
             "p.attn(h, need_weights=False, is_causal=True)",
             "Causal masks", 7),
    inverted_mask=("this mask is inverted (~causal_mask(L)): each token "
                   "attends only to the tokens after it. The book's "
                   "masks are True = may attend, so pass causal_mask(L) "
                   "as it is, or is_causal=True", "Causal masks", 7),
    raw_key_value=("attention gets norm1(x) as the query only: the keys "
                   "and values must be normalised too, attn(norm1(x))",
                   _BLOCK),
    pair_sum=("p.attn(...) returns a pair (output, weights): take "
              "[0] before adding it to x", _BLOCK),
    in_place=("this changes the caller's x in place (x += ...): write "
              "x = x + ...; in training the in-place add also breaks "
              "autograd, which needs the input that was overwritten",
              "Residual connections"),
)


class LlamaParts(nn.Module):
    """The parts of one Llama block (chapter 12 assembles them):
    ``norm1``, ``norm2`` (``nn.RMSNorm``, eps 1e-6), ``attn`` (attention
    without biases) and the SwiGLU's ``w1`` (the gate, HF's
    ``gate_proj``), ``w3`` (``up_proj``) and ``w2`` (``down_proj``)."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int) -> None:
        super().__init__()
        self.norm1 = nn.RMSNorm(d_model, eps=1e-6)
        self.attn = MultiHeadAttention(d_model, num_heads, bias=False)
        self.norm2 = nn.RMSNorm(d_model, eps=1e-6)
        self.w1 = nn.Linear(d_model, d_ff, bias=False)
        self.w3 = nn.Linear(d_model, d_ff, bias=False)
        self.w2 = nn.Linear(d_ff, d_model, bias=False)


def _llama_forward(p: LlamaParts, x: torch.Tensor, how: str = "right",
                   causal: bool = True) -> torch.Tensor:
    """Llama's block forward (causal), or a usual wrong one; with
    ``causal=False`` the wrong one as written without the mask too."""
    def attn(h):
        kv = x if how == "raw_key_value" else None
        if how == "inverted_mask":  # True = may attend, inverted
            return p.attn(h, kv, kv, mask=~causal_mask(h.size(1)),
                          need_weights=False)[0]
        return p.attn(h, kv, kv, need_weights=False,
                      is_causal=causal and how != "no_mask")[0]

    def ffn(z):
        a, g = p.w1(z), p.w3(z)
        if how == "gate_swapped":
            a, g = g, a
        act = {"no_silu": lambda t: t, "gelu": F.gelu, "relu": F.relu,
               "sigmoid": torch.sigmoid}.get(how, F.silu)
        if how == "silu_of_product":
            return p.w2(F.silu(a * g))
        return p.w2(act(a) if how == "no_gate" else act(a) * g)

    n1, n2 = p.norm1, p.norm2
    if how == "layer_norm":
        def n1(h):
            return F.layer_norm(h, h.shape[-1:], p.norm1.weight, eps=1e-6)

        def n2(h):
            return F.layer_norm(h, h.shape[-1:], p.norm2.weight, eps=1e-6)
    if how == "layer_norm_no_gain":  # F.layer_norm, no weight
        def n1(h):
            return F.layer_norm(h, h.shape[-1:], eps=1e-6)
        n2 = n1
    if how == "no_gain":
        def n1(h):
            return h * torch.rsqrt(h.square().mean(-1, keepdim=True) + 1e-6)
        n2 = n1
    if how in _MISWIRED:
        return _miswired(how, x, attn, ffn, n1, n2)
    if how == "swapped_order":
        h = x + ffn(n1(x))
        return h + attn(n2(h))
    if how == "raw_ffn_input":
        h = x + attn(n1(x))
        return h + ffn(h)
    h = x + attn(n1(x))
    out = h + ffn(n2(h))
    if how.startswith("final_norm"):  # a fresh RMSNorm, norm1 or norm2
        norm = {"final_norm1": n1, "final_norm2": n2}.get(
            how, lambda t: F.rms_norm(t, t.shape[-1:], eps=1e-6))
        return norm(out)
    return out


def _explain_llama(error: BaseException, _: object) -> object:
    """The hint for ``x + block.attn(...)`` without ``[0]``."""
    if isinstance(error, TypeError) and "tuple" in str(error):
        return LLAMA_BLOCK["pair_sum"]
    return None


def check_llama_block(
    fn: Callable[[LlamaParts, torch.Tensor], torch.Tensor],
) -> Verdict:
    """``fn(block, x)`` is Llama's block forward (chapter 12) from the
    parts of a :class:`LlamaParts` (pre-norm with RMSNorms, causal
    attention without biases, the SwiGLU FFN), ``(B, L, d_model)`` to
    ``(B, L, d_model)``. A wrong layout is named with or without the
    causal mask."""
    generator = torch.Generator().manual_seed(13)
    for batch, length, d_model, heads, d_ff in ((2, 5, 8, 2, 24),
                                                (1, 3, 6, 3, 16)):
        with torch.random.fork_rng():  # leave the reader's state alone
            torch.manual_seed(130 + length)
            block = LlamaParts(d_model, heads, d_ff).eval()
        with torch.no_grad():  # RMSNorm gains away from 1
            for norm in (block.norm1, block.norm2):
                norm.weight.uniform_(0.5, 1.5, generator=generator)
        x = torch.randn(batch, length, d_model, generator=generator) * 3
        given = x.clone()
        with torch.no_grad():
            expected = _llama_forward(block, x)
            call = attempt(fn, block, given, explain=_explain_llama)
        if call.verdict is not None:
            return call.verdict
        if not torch.equal(given, x):
            return LLAMA_BLOCK["in_place"].verdict(call.label)
        if isinstance(call.value, tuple):
            return Verdict(False, f"{call.label}: return the block's "
                                  "output tensor only")
        with torch.no_grad():
            problem = check_tensor(
                call.label, call.value, expected, axes="(B, L, d_model)",
                mistakes=[(LLAMA_BLOCK[how.rstrip("12")],
                           partial(_llama_forward, block, x, how, causal))
                          for causal in (True, False)
                          for how in (*LLAMA_BLOCK, "normalised_stream1",
                                      "normalised_stream2", "final_norm1",
                                      "final_norm2")
                          if how not in ("pair_sum", "in_place")
                          and (causal or how not in ("no_mask",
                                                     "inverted_mask"))])
        if problem is not None:
            return problem
    return Verdict(
        True, "h = x + attn(norm1(x)) (causal), then h + w2(silu(w1(z)) "
              "* w3(z)) with z = norm2(h): RMSNorms before each "
              "sublayer, no biases, the stream never normalised")


PARALLEL = catalogue(
    "check_parallel_block", 12,
    sequential=("this is the sequential pre-norm block, h = x + "
                "attn(norm1(x)), then h + ffn(norm2(h)): in the parallel "
                "block both sublayers read the same norm1(x), and both "
                "outputs are added to x at once", _BLOCK),
    sequential_one_norm=("the FFN reads norm1 of the stream after "
                         "attention's update: in the parallel block it "
                         "reads norm1(x), the same input as attention, "
                         "x + attn(norm1(x)) + ffn(norm1(x))", _BLOCK),
    two_norms=("the FFN reads norm2(x): that is GPT-NeoX's parallel form, "
               "a norm per sublayer. GPT-J's shares one, "
               "x + attn(norm1(x)) + ffn(norm1(x))", _BLOCK),
    raw_ffn_input=("the FFN reads the raw x: it reads the normalised "
                   "norm1(x), as attention does", _BLOCK),
    normalised_residual=("the residual adds norm1(x), not x: z = "
                         "norm1(x) feeds the sublayers only, and the "
                         "stream x is added as it is, x + attn(z) + "
                         "ffn(z)", "Residual connections"),
    no_residual=("the residual is missing: add x, x + attn(norm1(x)) + "
                 "ffn(norm1(x))", "Residual connections"),
    residual_twice=("x is added twice, once per sublayer, "
                    "(x + attn(...)) + (x + ffn(...)): the parallel block "
                    "adds x once, x + attn(norm1(x)) + ffn(norm1(x))",
                    "Residual connections"),
    post_norm=("the sum is normalised, norm1(x + attn(x) + ffn(x)): that "
               "is post-norm. GPT-J normalises the sublayers' input, "
               "x + attn(norm1(x)) + ffn(norm1(x))", _BLOCK),
    output_norm=("the block's output is normalised once more: the final "
                 "LayerNorm follows the whole stack, not each block",
                 _BLOCK),
    sum_normalised=("the sum is normalised, norm1(x + attn(z) + ffn(z)): "
                    "GPT-J is pre-norm, so the output x + attn(z) + ffn(z) "
                    "with z = norm1(x) is not normalised again", _BLOCK),
    no_mask=("this attention has no causal mask: GPT-J is a decoder, each "
             "token attends to itself and the tokens before it, "
             "block.attn(z, need_weights=False, is_causal=True) with "
             "z = norm1(x)",
             "Causal masks", 7),
    inverted_mask=("this mask is inverted (~causal_mask(L)): each token "
                   "attends only to the tokens after it. The book's masks "
                   "are True = may attend, so pass causal_mask(L) as it "
                   "is, or is_causal=True", "Causal masks", 7),
    no_activation=("the activation between the two FFN layers is missing: "
                   "block.linear2(block.activation(block.linear1(z)))",
                   "The feed-forward network"),
    fixed_relu=("this uses ReLU: the block's activation is "
                "block.activation (GELU here), "
                "block.linear2(block.activation(block.linear1(z)))",
                "The feed-forward network"),
    norm2_both=("both sublayers read norm2(x): GPT-J's one norm is "
                "norm1, x + attn(norm1(x)) + ffn(norm1(x))", _BLOCK),
    pair_sum=("block.attn(...) returns a pair (output, weights): take "
              "[0] before adding it to x", _BLOCK),
    whole_block=("that calls the block itself, which is sequential; the "
                 "exercise writes the parallel forward from its parts",
                 _BLOCK),
    in_place=("this changes the caller's x in place (x += ...): write "
              "x = x + ...; in training the in-place add also breaks "
              "autograd, which needs the input that was overwritten",
              "Residual connections"),
)


def _parallel_forward(block: TransformerBlock, x: torch.Tensor,
                      how: str = "right", causal: bool = True
                      ) -> torch.Tensor:
    """GPT-J's parallel block, x + attn(norm1(x)) + ffn(norm1(x)) with
    causal attention, or a usual wrong one; with ``causal=False`` the
    wrong one as written without the mask too."""
    def attn(h):
        if how == "inverted_mask":
            return block.attn(h, mask=~causal_mask(h.size(1)),
                              need_weights=False)[0]
        return block.attn(h, need_weights=False,
                          is_causal=causal and how != "no_mask")[0]

    def ffn(h):
        hidden = block.linear1(h)
        if how == "fixed_relu":
            return block.linear2(F.relu(hidden))
        return block.linear2(hidden if how == "no_activation"
                             else block.activation(hidden))

    n1, n2 = block.norm1, block.norm2
    if how == "norm2_both":
        n1 = n2
    with torch.no_grad():
        if how == "sequential":
            h = x + attn(n1(x))
            return h + ffn(n2(h))
        if how == "sequential_one_norm":
            h = x + attn(n1(x))
            return h + ffn(n1(h))
        if how == "post_norm":
            return n1(x + attn(x) + ffn(x))
        z = n1(x)
        f = {"two_norms": lambda: ffn(n2(x)),
             "raw_ffn_input": lambda: ffn(x)}.get(how, lambda: ffn(z))()
        if how == "no_residual":
            return attn(z) + f
        if how == "normalised_residual":
            return z + attn(z) + f
        if how == "residual_twice":
            return 2 * x + attn(z) + f
        if how == "sum_normalised":
            return n1(x + attn(z) + f)
        out = x + attn(z) + f
        return F.layer_norm(out, out.shape[-1:]) if how == "output_norm" \
            else out


def check_parallel_block(
    fn: Callable[[TransformerBlock, torch.Tensor], torch.Tensor],
) -> Verdict:
    """Exercise 12.2: ``fn(block, x)`` is GPT-J's parallel block from the
    parts of a :class:`~mha_lib.TransformerBlock` in eval mode, causal:
    ``x + attn(norm1(x)) + ffn(norm1(x))``, ``(B, L, d_model)`` to
    ``(B, L, d_model)`` (``norm2`` is not used). A wrong layout is named
    with or without the causal mask."""
    generator = torch.Generator().manual_seed(14)
    for batch, length, d_model, heads in ((2, 5, 8, 4), (1, 3, 6, 2)):
        block = _test_block(d_model, heads, 140 + length, generator)
        x = torch.randn(batch, length, d_model, generator=generator) * 3
        with torch.no_grad():
            expected = _parallel_forward(block, x)
        call, refusal = _run_on_block(
            fn, block, x, _explain_parallel, PARALLEL,
            lambda label: Verdict(False, f"{label}: return the block's "
                                         "output tensor only"))
        if refusal is not None:
            return refusal
        problem = check_tensor(
            call.label, call.value, expected, axes="(B, L, d_model)",
            mistakes=[(PARALLEL[how], partial(_parallel_forward, block, x,
                                              how, causal))
                      for causal in (True, False)
                      for how in PARALLEL
                      if how not in ("pair_sum", "whole_block", "in_place")
                      and (causal or how not in ("no_mask",
                                                 "inverted_mask"))])
        if problem is not None:
            return problem
    return Verdict(
        True, "x + attn(norm1(x)) + ffn(norm1(x)), causal: both sublayers "
              "read the same normalised input and are added to x at once "
              "(norm2 unused, as GPT-J has one norm per block)")


def _explain_parallel(error: BaseException, _: object) -> object:
    """The hint for ``x + block.attn(...)`` without ``[0]``."""
    if isinstance(error, TypeError) and "tuple" in str(error):
        return PARALLEL["pair_sum"]
    return None
