"""Checkers for chapter 11's exercises (checking against PyTorch)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from mha_lib.exercises.verdict import Verdict, close
from mha_lib.interop import to_torch_mha
from mha_lib.masks import causal_mask, padding_mask
from mha_lib.mha import MultiHeadAttention

__all__ = ["check_to_torch", "check_torch_masks", "check_sdpa_attention"]


def _module(
    d_model: int, num_heads: int, bias: bool, seed: int
) -> MultiHeadAttention:
    with torch.random.fork_rng():  # leave the reader's random state alone
        torch.manual_seed(seed)
        return MultiHeadAttention(d_model, num_heads, bias=bias).eval()


def check_to_torch(
    fn: Callable[[MultiHeadAttention], nn.MultiheadAttention],
) -> Verdict:
    """Exercise 11.1: ``fn(m)`` returns an
    ``nn.MultiheadAttention(batch_first=True)`` with the weights of ``m``
    (written by hand, without :func:`to_torch_mha`)."""
    generator = torch.Generator().manual_seed(11)
    for d_model, num_heads, bias in ((8, 4, True), (12, 3, False),
                                     (6, 1, True)):
        m = _module(d_model, num_heads, bias, seed=d_model)
        try:
            t = fn(m)
        except Exception as error:
            # the reader's code: report it, do not crash the notebook
            return Verdict(
                False, f"fn(MultiHeadAttention({d_model}, {num_heads}, "
                       f"bias={bias})) "
                       f"raised {type(error).__name__}: {error}")
        if not isinstance(t, nn.MultiheadAttention):
            return Verdict(
                False, f"fn should return an nn.MultiheadAttention, "
                       f"got {type(t).__name__}")
        if not t.batch_first:
            return Verdict(
                False, "make it with batch_first=True, so that it takes "
                       "(B, L, d_model) like mha_lib")
        query = torch.randn(3, 4, d_model, generator=generator)
        memory = torch.randn(3, 6, d_model, generator=generator)
        with torch.no_grad():
            for key in (query, memory):  # self- and cross-attention
                want, _ = m(query, key, key)
                try:
                    given, _ = t(query, key, key, need_weights=True)
                except Exception as error:
                    # the reader's module: report, do not crash
                    return Verdict(
                        False, f"the returned module raised "
                               f"{type(error).__name__}: {error}")
                verdict = close(
                    f"its output (d_model={d_model}, bias={bias}, "
                    f"Lk={key.size(1)})", given, want, "")
                if not verdict:
                    return Verdict(False, verdict.message + (
                        ": is in_proj_weight [W_q; W_k; W_v], "
                        "stacked along dim 0, biases included?"))
    return Verdict(
        True, "in_proj_weight = cat([W_q, W_k, W_v]), out_proj copied")


def check_torch_masks(
    fn: Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]],
) -> Verdict:
    """Exercise 11.2: ``fn(valid_lens, length)`` returns
    ``(key_padding_mask, attn_mask)`` for ``nn.MultiheadAttention`` that
    mean what ``padding_mask(valid_lens) & causal_mask(length)`` means to
    ``mha_lib``."""
    generator = torch.Generator().manual_seed(111)
    m = _module(8, 4, True, seed=0)
    t = to_torch_mha(m)
    for valid_lens, length in ((torch.tensor([6, 4, 3]), 6),
                               (torch.tensor([1, 5]), 5)):
        x = torch.randn(len(valid_lens), length, 8, generator=generator)
        try:
            key_padding_mask, attn_mask = fn(valid_lens.clone(), length)
        except Exception as error:
            # the reader's code: report it, do not crash the notebook
            return Verdict(
                False, f"fn({valid_lens.tolist()}, {length}) raised "
                       f"{type(error).__name__}: {error}")
        valid = padding_mask(valid_lens, length)[:, 0, 0]  # (B, Lk)
        if (isinstance(key_padding_mask, torch.Tensor)
                and key_padding_mask.dtype == torch.bool
                and key_padding_mask.shape == valid.shape
                and torch.equal(key_padding_mask, valid)):
            return Verdict(
                False, "key_padding_mask is True on the real tokens: "
                       "nn.MultiheadAttention reads True as "
                       "'ignore this key', so invert it")
        if (isinstance(attn_mask, torch.Tensor)
                and attn_mask.dtype == torch.bool
                and torch.equal(attn_mask, causal_mask(length))):
            return Verdict(
                False, "attn_mask is True on the allowed keys: "
                       "nn.MultiheadAttention reads True as 'not allowed', "
                       "so invert it")
        with torch.no_grad():
            want, _ = m(x, mask=(padding_mask(valid_lens, length)
                                 & causal_mask(length)))
            try:
                given, _ = t(x, x, x, key_padding_mask=key_padding_mask,
                             attn_mask=attn_mask)
            except Exception as error:
                # the reader's masks: report, do not crash
                return Verdict(
                    False, f"nn.MultiheadAttention refused the masks: "
                           f"{type(error).__name__}: {error}")
        verdict = close(
            f"the output with fn({valid_lens.tolist()}, {length})",
            given, want, "")
        if not verdict:
            return verdict
    return Verdict(
        True,
        "key_padding_mask = ~valid, attn_mask = ~causal: True = blocked")


def check_sdpa_attention(
    fn: Callable[[MultiHeadAttention, torch.Tensor, torch.Tensor | None],
                 torch.Tensor],
) -> Verdict:
    """Exercise 11.3: ``fn(m, x, mask)`` computes ``m(x, mask=mask)[0]``
    with ``m``'s layers and
    ``torch.nn.functional.scaled_dot_product_attention`` for the
    attention."""
    generator = torch.Generator().manual_seed(1111)
    for d_model, num_heads in ((8, 4), (12, 3)):
        m = _module(d_model, num_heads, True, seed=d_model)
        x = torch.randn(3, 6, d_model, generator=generator)
        masks = {
            "no mask": None,
            "causal": causal_mask(6),
            "padding & causal": (padding_mask(torch.tensor([6, 4, 3]), 6)
                                 & causal_mask(6)),
        }
        for name, mask in masks.items():
            with torch.no_grad():
                want, _ = m(x, mask=mask)
                try:
                    given = fn(m, x, mask)
                except Exception as error:
                    # the reader's code: report, do not crash
                    return Verdict(
                        False, f"fn(m, x, {name}) raised "
                               f"{type(error).__name__}: {error}")
            verdict = close(
                f"fn(m, x, {name}) "
                f"(d_model={d_model}, num_heads={num_heads})",
                given, want, "")
            if not verdict:
                return verdict
    return Verdict(
        True, "the fused kernel takes the library's bool mask as it is")
