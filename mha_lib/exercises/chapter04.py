"""Checkers for chapter 4's exercises (queries, keys and values)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

from mha_lib.exercises.verdict import (
    MATMUL,
    Verdict,
    attempt,
    catalogue,
    check_number,
    check_tensor,
)
from mha_lib.mha import MultiHeadAttention
from mha_lib.positional import sinusoidal_encoding

__all__ = [
    "check_projection",
    "check_fused_projection",
    "check_projection_parameters",
    "check_previous_token",
]


Projection = Callable[[torch.Tensor, torch.Tensor, torch.Tensor],
                      torch.Tensor]
FusedProjection = Callable[[torch.Tensor, MultiHeadAttention],
                           tuple[torch.Tensor, torch.Tensor, torch.Tensor]]

_LAYERS = "Three linear layers"

PROJECTION = catalogue(
    "check_projection", 4,
    not_transposed=("the weight is not transposed: nn.Linear stores it as "
                    "(d_out, d_in), so the product is x @ weight.T",
                    _LAYERS),
    no_bias=("the bias is missing: add it to every row", _LAYERS),
    not_at=("the exercise computes it with @ only, not F.linear, "
            "nn.Linear, addmm or einsum", "All tokens at once"),
    view=("x is not contiguous here (a transposed tensor, as a real "
          "pipeline makes), so view cannot flatten it: @ broadcasts over "
          "the leading axes, no reshape needed (or use reshape)",
          "All tokens at once"),
)


def _explain_view(mistake):
    def explain(error: BaseException, record) -> object:
        return mistake if "view size is not compatible" in str(error) \
            else None
    return explain


def _untransposed(x: torch.Tensor, weight: torch.Tensor,
                  bias: torch.Tensor) -> torch.Tensor:
    return x @ weight + bias  # fits the shapes only when d_in == d_out


def check_projection(fn: Projection) -> Verdict:
    """Exercise 4.1: ``fn(x, weight, bias)`` computes
    ``x @ weight.T + bias`` as ``nn.Linear`` does, with ``@`` only, for
    inputs ``(B, L, d_in)`` and ``weight`` ``(d_out, d_in)``."""
    generator = torch.Generator().manual_seed(4)
    # square first: there a weight that is not transposed gives numbers
    for batch, length, d_in, d_out in ((3, 6, 8, 8), (2, 5, 8, 4),
                                       (1, 3, 6, 10), (4, 2, 6, 3)):
        x = torch.randn(length, batch, d_in,
                        generator=generator).transpose(0, 1)  # (B, L, d_in)
        if batch != 4:
            x = x.contiguous()
        weight = torch.randn(d_out, d_in, generator=generator)
        bias = torch.randn(d_out, generator=generator)
        call = attempt(fn, x, weight, bias,
                       shown=f"x {(batch, length, d_in)}, weight "
                             f"{(d_out, d_in)}, bias {(d_out,)}",
                       explain=_explain_view(PROJECTION["view"]))
        if call.verdict is not None:
            return call.verdict
        if call.record.used(F.linear, torch.addmm, torch.Tensor.addmm,
                            torch.baddbmm, torch.einsum, torch.tensordot,
                            F.bilinear):
            return PROJECTION["not_at"].verdict(call.label)
        problem = check_tensor(
            call.label, call.value, F.linear(x, weight, bias),
            axes="(B, L, d_out)", mistakes=[
                (PROJECTION["not_transposed"],
                 partial(_untransposed, x, weight, bias)),
                (PROJECTION["no_bias"], x @ weight.T),
            ])
        if problem is not None:
            return problem
    return Verdict(
        True, "x @ weight.T + bias, as nn.Linear, also for d_in != d_out")


FUSED = catalogue(
    "check_fused_projection", 4,
    three_products=("that is one matrix product per projection: stack "
                    "the three weights into one (3 d_model, d_model) "
                    "matrix and multiply once", _LAYERS),
    no_bias=("the biases are missing: stack the three biases into one "
             "(3 d_model,) vector and add it", _LAYERS),
    order=("q, k and v come out in the wrong order: return them in the "
           "order you stacked the weights, q_proj, k_proj, v_proj",
           _LAYERS),
    wrong_axis=("The weights are (out, in): stack them along dim 0, the "
                "output axis, to get (3 d_model, d_model)", _LAYERS),
    split_axis=("split the features, the last axis, into three: "
                "chunk(3, dim=-1)", _LAYERS),
    interleaved=("the fused output is stacked by role: q's d_model "
                 "features first, then k's, then v's. Cut it into "
                 "three contiguous blocks with chunk(3, dim=-1), not "
                 "every third feature (view(..., d_model, 3))",
                 _LAYERS),
    per_head=("the fused output is cut per head, UvA's layout: "
              "reshape(B, L, H, -1).chunk(3) assumes the weight rows "
              "are stacked head by head (q, k, v of head 0, then of "
              "head 1, ...). Here they are stacked by role, q's d_model "
              "rows first, so cut the (B, L, 3 d_model) output into "
              "three blocks with chunk(3, dim=-1) and leave the heads "
              "to chapter 5", _LAYERS),
    no_gradient=("no gradient reaches the module's weights, so the "
                 "projections could not be trained: no .detach(), .data "
                 "or torch.no_grad() on the way", _LAYERS),
    fixed_size=("right for d_model = 8, but the function must work for "
                "any d_model: the checker also tries "
                "MultiHeadAttention(12, 3), whose stacked weight is "
                "(36, 12); take the sizes from mha.d_model or the "
                "weights, not the numbers 24 and 8", _LAYERS),
)


def _explain_fused(error: BaseException, record) -> object:
    for _, args, kwargs in record.find(torch.cat, torch.concat,
                                       torch.concatenate):
        dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
        if dim not in (0, -2):
            return FUSED["wrong_axis"]
    return None


def _three_of_width(given: object, d_model: int) -> bool:
    """Whether ``given`` is three tensors of ``d_model`` features."""
    return (isinstance(given, (tuple, list)) and len(given) == 3
            and all(isinstance(t, torch.Tensor) and t.dim()
                    and t.size(-1) == d_model for t in given))


def check_fused_projection(fn: FusedProjection) -> Verdict:
    """Exercise 4.2: ``fn(x, mha)`` returns ``(q, k, v)`` of ``mha``'s three
    projections, computed with a single matrix product, with gradients
    reaching ``mha``'s weights."""
    for d_model, heads, batch, length in ((8, 4, 3, 6), (12, 3, 2, 5)):
        with torch.random.fork_rng():  # leave the reader's random state
            torch.manual_seed(4 + d_model)
            mha = MultiHeadAttention(d_model, heads)
            x = torch.randn(batch, length, d_model)
        layers = (mha.q_proj, mha.k_proj, mha.v_proj)
        call = attempt(fn, x, mha, explain=_explain_fused)
        given = call.value
        if d_model != 8 and (call.verdict is not None
                             or not _three_of_width(given, d_model)):
            return FUSED["fixed_size"].verdict(call.label)  # 8 passed
        if call.verdict is not None:
            return call.verdict
        if not isinstance(given, (tuple, list)) or len(given) != 3:
            return Verdict(False, f"{call.label} should return three "
                                  f"tensors (q, k, v)")
        products = len(call.record.find(*MATMUL))
        if products > 1:
            return FUSED["three_products"].verdict(call.label)
        with torch.no_grad():
            want = [layer(x) for layer in layers]
            bare = [x @ layer.weight.T for layer in layers]
            woven = torch.cat(want, dim=-1).view(
                batch, length, d_model, 3).unbind(-1)  # every third
            uva = torch.cat(want, dim=-1).reshape(
                batch, length, heads, -1).chunk(3, dim=-1)  # per head
        for name, tensor, expected, no_bias, every_third in zip(
                "qkv", given, want, bare, woven, strict=True):
            label = f"{name} of {call.label}"
            others = [(FUSED["order"], w) for w in want
                      if w is not expected]
            wide = (isinstance(tensor, torch.Tensor) and tensor.dim()
                    and tensor.size(-1) == 3 * d_model)
            if wide:
                return FUSED["split_axis"].verdict(label)
            if isinstance(tensor, torch.Tensor) and any(
                    tensor.shape == u.shape
                    and torch.allclose(tensor.detach(), u, atol=1e-5)
                    for u in uva):  # one of UvA's per-head chunks
                return FUSED["per_head"].verdict(label)
            problem = check_tensor(
                label, tensor, expected, axes="(B, L, d_model)",
                mistakes=[(FUSED["no_bias"], no_bias),
                          (FUSED["interleaved"], every_third), *others])
            if problem is not None:
                return problem
        if not all(t.requires_grad for t in given):
            return FUSED["no_gradient"].verdict(call.label)
        probe = torch.randn(3, *want[0].shape,
                            generator=torch.Generator().manual_seed(41))
        params = [p for layer in layers for p in layer.parameters()]
        grads = torch.autograd.grad(
            sum((t * p).sum() for t, p in zip(given, probe, strict=True)),
            params, allow_unused=True)
        wanted = torch.autograd.grad(
            sum((layer(x) * p).sum()
                for layer, p in zip(layers, probe, strict=True)), params)
        if any(g is None or not torch.allclose(g, w, atol=1e-4)
               for g, w in zip(grads, wanted, strict=True)):
            return FUSED["no_gradient"].verdict(call.label)
    return Verdict(
        True,
        "one (24, 8) weight and one (24,) bias give q, k and v at once")


PARAMETERS = catalogue(
    "check_projection_parameters", 4,
    no_bias=("the biases are missing: that is the paper's count, but "
             "the library's nn.Linear layers add d_model biases each",
             _LAYERS),
    with_output=("that counts a fourth layer, the output projection; the "
                 "question is about q, k and v only", _LAYERS),
    per_head=("that is one head's share: the heads split the same 512 "
              "output features, so the count does not depend on them",
              _LAYERS),
    one_layer=("that is one projection; there are three, for q, k and v",
               _LAYERS),
    one_bias=("that counts one bias vector for the three layers; each "
              "nn.Linear has its own d_model biases, so there are "
              "3 d_model of them", _LAYERS),
    times_heads=("that multiplies by the number of heads, but the heads "
                 "do not each get their own layers: they share out the "
                 "output features of the same three d_model x d_model "
                 "layers", _LAYERS),
    fixed_head_width=("that keeps d_k = 64 and doubles the heads, so "
                      "each layer would have 1024 outputs; but d_k = "
                      "d_model / H: 16 heads get 32 features each, from "
                      "the same 512 x 512 layers", _LAYERS),
)


def check_projection_parameters(n: int, d_model: int = 512) -> Verdict:
    """Exercise 4.3: the number of parameters in the query, key and value
    projections of ``MultiHeadAttention(d_model, ...)`` (with bias), here
    ``d_model = 512``."""
    with torch.random.fork_rng():  # leave the reader's random state alone
        mha = MultiHeadAttention(d_model, 8)
    expected = sum(p.numel()
                   for proj in (mha.q_proj, mha.k_proj, mha.v_proj)
                   for p in proj.parameters())
    d = d_model
    problem = check_number("n", n, expected, mistakes=[
        (PARAMETERS["no_bias"], 3 * d * d),
        (PARAMETERS["with_output"], 4 * (d * d + d)),
        (PARAMETERS["per_head"], 3 * (d * d + d) // 8),
        (PARAMETERS["per_head"], 3 * (d * (d // 8) + d // 8)),
        (PARAMETERS["one_layer"], d * d + d),
        (PARAMETERS["one_bias"], 3 * d * d + d),
        (PARAMETERS["times_heads"], 8 * 3 * (d * d + d)),
        (PARAMETERS["times_heads"], 8 * 3 * d * d),
        (PARAMETERS["fixed_head_width"], 3 * (d * 2 * d + 2 * d)),
        (PARAMETERS["fixed_head_width"], 3 * d * 2 * d),
    ])
    if problem is not None:
        return problem
    return Verdict(
        True,
        f"3 x ({d_model} x {d_model} + {d_model}) = {expected:,}, "
        "whatever the number of heads")


_AT_WORK = "The projections at work"

PREVIOUS = catalogue(
    "check_previous_token", 4,
    shared=("one layer for queries and keys: the scores q_t . q_j are "
            "symmetric, and a token's own score |q_t|^2 tops its row "
            "when all queries are equally long (rotated positions are). "
            "Give the keys a layer of their own", _AT_WORK),
    next_token=("every token looks at the next one, t + 1: the step on "
                "the query layer, q_proj, goes the wrong way. nn.Linear "
                "stores the transpose of W (weight is (out, in)), so "
                "q_proj.weight = M^T makes W^Q = M, a step on; store M, "
                "for W^Q = M^T, a step back",
                "Three linear layers"),
    next_token_key=("every token looks at the next one, t + 1: the step "
                    "on the key layer, k_proj, goes the wrong way. "
                    "nn.Linear stores the transpose of W, so "
                    "k_proj.weight = M makes W^K = M^T and "
                    "k_j = PE_{j-1}: q_t . k_j then peaks at j = t + 1. "
                    "Store M^T, for W^K = M: keys a step on",
                    "Three linear layers"),
    itself=("every token looks at itself: q_t . k_j still peaks at "
            "j = t, as with W^Q (W^K)^T = I; move the queries one step "
            "back (or the keys one step on) first", _AT_WORK),
    too_flat=("token t - 1 tops every row, but the softmax is too "
              "flat: scale W^Q up (say 10 times); the scores grow with "
              "it and the largest weight with them", _AT_WORK),
)


def _multiple_of(t: torch.Tensor, pos: torch.Tensor) -> bool:
    """Whether ``t`` is ``c * pos`` for a number c: a layer that only
    scales the positions, with no step of its own."""
    t, pos = t.double(), pos.double()
    c = (t * pos).sum() / (pos * pos).sum()
    return bool(torch.allclose(t, c * pos, atol=1e-4 * (1 + abs(c))))


def check_previous_token(q_proj: Callable[[torch.Tensor], torch.Tensor],
                         k_proj: Callable[[torch.Tensor], torch.Tensor]
                         ) -> Verdict:
    """Exercise 4.4: two ``nn.Linear(8, 8)`` layers with which, on the
    positions alone (``sinusoidal_encoding(6, 8)``), every token t >= 1
    puts at least half of its attention weight
    ``softmax(Q K^T / sqrt(8))`` on token t - 1."""
    pos = sinusoidal_encoding(6, 8)  # (L, d_model): positions only
    with torch.no_grad():
        q_call, k_call = attempt(q_proj, pos), attempt(k_proj, pos)
    for call in (q_call, k_call):
        if call.verdict is not None:
            return call.verdict
    Q, K = q_call.value, k_call.value
    for name, t in (("q_proj(pos)", Q), ("k_proj(pos)", K)):
        if not isinstance(t, torch.Tensor) or t.shape != (6, 8):
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) \
                else type(t).__name__
            return Verdict(False, f"{name}: expected shape (L, d_model) "
                                  f"= (6, 8), got {shape}")
    weights = (Q.double() @ K.double().T / 8**0.5).softmax(dim=-1)
    rows = torch.arange(1, 6)  # tokens t = 1 .. 5
    favourite = weights[1:].argmax(dim=-1) - rows  # (5,): j - t
    on_previous = weights[rows, rows - 1]  # (5,): weight on t - 1
    if bool((favourite == -1).all()) and bool((on_previous >= 0.5).all()):
        return Verdict(
            True, f"every token t = 1..5 puts {on_previous.min():.2f} or "
                  "more of its weight on t - 1: a previous-token head")
    if q_proj is k_proj or torch.equal(Q, K):
        label = ("q_proj is k_proj" if q_proj is k_proj
                 else "q_proj(pos) equals k_proj(pos)")
        return PREVIOUS["shared"].verdict(label)
    if bool((favourite == -1).all()):
        return PREVIOUS["too_flat"].verdict(
            f"least weight on t - 1: {on_previous.min():.2f}")
    inner = favourite[:-1]  # t = 1 .. 4: t + 1 exists
    if bool((inner == 1).all()):
        if _multiple_of(K, pos):  # the keys are the positions: the step
            return PREVIOUS["next_token"].verdict("q_proj")  # is on Q
        if _multiple_of(Q, pos):
            return PREVIOUS["next_token_key"].verdict("k_proj")
        return PREVIOUS["next_token"].verdict("q_proj, k_proj")
    if bool((favourite == 0).all()):
        return PREVIOUS["itself"].verdict("q_proj, k_proj")
    t = int((favourite != -1).nonzero()[0]) + 1
    return Verdict(
        False, f"token {t} puts most weight on token "
               f"{t + int(favourite[t - 1])}, not {t - 1}: the score "
               "q_t . k_j should be largest at j = t - 1 "
               f"(see '{_AT_WORK}' in chapter 4)")
