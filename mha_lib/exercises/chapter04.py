"""Checkers for chapter 4's exercises (queries, keys and values)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from mha_lib.exercises.verdict import Verdict, close, compare
from mha_lib.mha import MultiHeadAttention

__all__ = [
    "check_projection",
    "check_fused_projection",
    "check_projection_parameters",
]


Projection = Callable[[torch.Tensor, torch.Tensor, torch.Tensor],
                      torch.Tensor]
FusedProjection = Callable[[torch.Tensor, MultiHeadAttention],
                           tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def check_projection(fn: Projection) -> Verdict:
    """Exercise 4.1: ``fn(x, weight, bias)`` computes
    ``x @ weight.T + bias`` as ``nn.Linear`` does, for inputs
    ``(B, L, d_in)`` and ``weight`` ``(d_out, d_in)``."""
    generator = torch.Generator().manual_seed(4)
    for batch, length, d_in, d_out in ((3, 6, 8, 8), (2, 5, 8, 4),
                                       (1, 3, 6, 10)):
        x = torch.randn(batch, length, d_in, generator=generator)
        weight = torch.randn(d_out, d_in, generator=generator)
        bias = torch.randn(d_out, generator=generator)
        name = (f"fn(x {(batch, length, d_in)}, weight {(d_out, d_in)}, "
                f"bias {(d_out,)})")
        try:
            given = fn(x, weight, bias)
        except Exception as error:
            # the reader's code: report it, do not crash the notebook
            return Verdict(
                False, f"{name} raised {type(error).__name__}: {error}")
        verdict = close(name, given, F.linear(x, weight, bias), "")
        if not verdict:
            return verdict
    return Verdict(
        True, "x @ weight.T + bias, as nn.Linear, also for d_in != d_out")


def check_fused_projection(fn: FusedProjection) -> Verdict:
    """Exercise 4.2: ``fn(x, mha)`` returns ``(q, k, v)`` of ``mha``'s three
    projections, computed with a single matrix product."""
    with torch.random.fork_rng():  # leave the reader's random state alone
        torch.manual_seed(4)
        mha = MultiHeadAttention(8, 4)
        x = torch.randn(3, 6, 8)
    try:
        given = fn(x, mha)
    except Exception as error:
        # the reader's code: report it, do not crash the notebook
        return Verdict(
            False, f"fn(x, mha) raised {type(error).__name__}: {error}")
    if not isinstance(given, (tuple, list)) or len(given) != 3:
        return Verdict(
            False, "fn(x, mha) should return three tensors (q, k, v)")
    with torch.no_grad():
        projections = (mha.q_proj, mha.k_proj, mha.v_proj)
        for name, tensor, proj in zip("qkv", given, projections,
                                      strict=True):
            verdict = close(name, tensor, proj(x), "")
            if not verdict:
                return verdict
    return Verdict(
        True,
        "one (24, 8) weight and one (24,) bias give q, k and v at once")


def check_projection_parameters(n: int, d_model: int = 512) -> Verdict:
    """Exercise 4.3: the number of parameters in the query, key and value
    projections of ``MultiHeadAttention(d_model, ...)`` (with bias), here
    ``d_model = 512``."""
    with torch.random.fork_rng():  # leave the reader's random state alone
        mha = MultiHeadAttention(d_model, 8)
    expected = sum(p.numel()
                   for proj in (mha.q_proj, mha.k_proj, mha.v_proj)
                   for p in proj.parameters())
    return compare(
        "n", n, expected,
        f"3 x ({d_model} x {d_model} + {d_model}) = {expected:,}, "
        "whatever the number of heads")
