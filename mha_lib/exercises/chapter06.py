"""Checkers for chapter 6's exercises (scaled dot-product attention)."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch

from mha_lib.attention import scaled_dot_product_attention
from mha_lib.exercises.verdict import (
    Mistake,
    Verdict,
    attempt,
    catalogue,
    check_tensor,
    source_names,
)

__all__ = ["check_attention", "check_temperature", "check_softmax_jacobian"]

# (batch..., Lq, Lk, D, Dv): self-attention, cross-attention (Lq != Lk),
# D != Dv, no batch.
_SHAPES = [((3, 4), 6, 6, 2, 2), ((2,), 3, 5, 4, 7), ((), 1, 4, 8, 3),
           ((2, 3), 4, 7, 6, 5)]

_SCALE = "Why divide by $\\sqrt{d_k}$"
_SOFTMAX = "The softmax: weights that sum to one"
_SATURATES = "What goes wrong without the scale: softmax saturates"
_SCORES = "Scores: one dot product per query and key"
_FUNCTION = "All steps in one function, checked twice"


def _qkv(seed: int, batch: tuple[int, ...], lq: int, lk: int, d: int,
         dv: int, grad: bool = False):
    # private: the reader's global seed is untouched
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*batch, n, w, generator=g, requires_grad=grad)
                 for n, w in ((lq, d), (lk, d), (lk, dv)))


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            scale: float, dim: int = -1
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention with a given scale, softmax over ``dim``: the usual wrong
    answers."""
    weights = torch.softmax(q @ k.transpose(-2, -1) * scale, dim=dim)
    return weights @ v, weights


def _attend_after_softmax(q: torch.Tensor, k: torch.Tensor,
                          v: torch.Tensor, scale: float
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """The scale applied to the weights, after the softmax: rows then sum
    to ``scale``, not 1."""
    weights = torch.softmax(q @ k.transpose(-2, -1), dim=-1) * scale
    return weights @ v, weights


def _attend_swapped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys scored against queries, k @ q^T: a wrong answer that fits the
    shapes when Lq = Lk."""
    weights = torch.softmax(k @ q.transpose(-2, -1) * scale, dim=-1)
    return weights @ v, weights


def _swaps_other_axes(args: tuple, kwargs: dict) -> bool:
    """Whether a recorded ``transpose(t, a, b)`` swaps axes other than the
    last two (``k.transpose(1, 2)`` swaps H and Lk of a 4-D ``k``)."""
    dims = [*args[1:3], *(kwargs.get(n) for n in ("dim0", "dim1", "axis0",
                                                  "axis1") if n in kwargs)]
    if not args or not isinstance(args[0], torch.Tensor) or len(dims) != 2:
        return False
    n = args[0].dim()
    return {int(d) % n for d in dims} != {n - 2, n - 1}


def _explain_scores(mistake: Mistake):
    swaps = (torch.Tensor.transpose, torch.transpose,
             torch.Tensor.mT.__get__, torch.Tensor.T.__get__,
             torch.Tensor.permute, torch.permute, torch.Tensor.swapaxes,
             torch.swapaxes, torch.einsum, torch.Tensor.t, torch.t,
             torch.Tensor.movedim)

    def explain(error: BaseException, record) -> Mistake | None:
        if record.used(torch.Tensor.T.__get__):
            return ATTENTION["dot_T"]
        if any(_swaps_other_axes(args, kwargs) for _, args, kwargs in
               record.find(torch.Tensor.transpose, torch.transpose,
                           torch.Tensor.swapaxes, torch.swapaxes)):
            return ATTENTION["transposed_batch_axis"]
        if not record.used(*swaps):
            return mistake
        return None
    return explain


def _part(make: Callable, index: int) -> torch.Tensor:
    return make()[index]


def _compare_pair(
    call, want: tuple[torch.Tensor, torch.Tensor],
    wrong: list[tuple[Mistake, Callable]],
) -> Verdict | None:
    """The reader's ``(output, weights)`` against the library's, weights
    first; ``wrong`` pairs a mistake with the pair it would give."""
    got = call.value
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return Verdict(False, f"{call.label} should return a pair "
                              f"(output, weights), got "
                              f"{type(got).__name__} (see '{_FUNCTION}' "
                              f"in chapter 6)")
    for index, name, axes in ((1, "weights", "(..., Lq, Lk)"),
                              (0, "output", "(..., Lq, Dv)")):
        problem = check_tensor(
            f"the {name} of {call.label}", got[index], want[index],
            axes=axes,
            mistakes=[(ATTENTION["swapped_pair"], want[1 - index]),
                      *[(m, partial(_part, p, index)) for m, p in wrong]])
        if problem is not None:
            return problem
    return None


def _gradients(call, inputs: tuple[torch.Tensor, ...],
               want: torch.Tensor, mistake: Mistake) -> Verdict | None:
    """The gradients through the reader's output, against the library's."""
    output = call.value[0]
    if not output.requires_grad:
        return mistake.verdict(call.label)
    probe = torch.randn(want.shape,
                        generator=torch.Generator().manual_seed(61))
    try:
        given = torch.autograd.grad((output * probe).sum(), inputs,
                                    allow_unused=True)
    except RuntimeError as error:  # an in-place change, for instance
        return Verdict(False, f"backward through {call.label} raised "
                              f"RuntimeError: {error}")
    expected = torch.autograd.grad((want * probe).sum(), inputs)
    for g, w in zip(given, expected, strict=True):
        if g is None or not torch.allclose(g, w, atol=1e-4, rtol=1e-4):
            return mistake.verdict(call.label)
    return None


ATTENTION = catalogue(
    "check_attention", 6,
    unscaled=("the scores are not scaled: divide them by sqrt(d_k), "
              "d_k = q.size(-1)", _SCALE),
    scaled_by_dk=("the scores are divided by d_k; the scale is "
                  "1 / sqrt(d_k)", _SCALE),
    scaled_by_dv=("the scale uses the value size; it is 1 / sqrt(d_k) "
                  "with d_k = q.size(-1), the width of queries and keys",
                  _SCALE),
    scaled_by_length=("the scale uses the number of keys; it is "
                      "1 / sqrt(d_k), the width of queries and keys",
                      _SCALE),
    multiplied=("the scores are multiplied by sqrt(d_k); divide them",
                _SCALE),
    softmax_dim=("the softmax runs over the queries (dim=-2): each "
                 "query's weights over the keys, the last axis, must sum "
                 "to one", _SOFTMAX),
    after_softmax=("the weights are divided by sqrt(d_k) after the "
                   "softmax, so each row sums to 1 / sqrt(d_k), not 1: "
                   "scale the scores, then take the softmax", _SOFTMAX),
    k_not_transposed=("k needs its last two axes swapped: q @ "
                      "k.transpose(-2, -1), (Lq, D) @ (D, Lk)", _SCORES),
    swapped_qk=("that is k @ q^T, the keys scored against the queries: "
                "row i of the weights must belong to query i, "
                "q @ k.transpose(-2, -1)", _SCORES),
    transposed_batch_axis=("k.transpose swaps two axes other than the "
                           "last two: for (B, H, Lk, D) keys, "
                           "k.transpose(1, 2) swaps H and Lk; swap Lk "
                           "and D, k.transpose(-2, -1)", _SCORES),
    dot_T=("k.T reverses every axis of a batched tensor: swap only the "
           "last two, k.transpose(-2, -1) or k.mT", _SCORES),
    swapped_pair=("the pair is (weights, output); return (output, "
                  "weights)", "All steps in one function, checked twice"),
    no_gradient=("the gradients differ from the library's: no .detach(), "
                 ".data, torch.no_grad() or in-place change on the way",
                 "All steps in one function, checked twice"),
)


def check_attention(
    fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor],
                 tuple[torch.Tensor, torch.Tensor]],
) -> Verdict:
    """Exercise 6.1: ``fn(q, k, v) -> (output, weights)``, unmasked scaled
    dot-product attention, for any leading dims, ``Lq != Lk`` and
    ``D != Dv``, gradients included."""
    for seed, (batch, lq, lk, d, dv) in enumerate(_SHAPES):
        q, k, v = _qkv(seed, batch, lq, lk, d, dv, grad=True)
        call = attempt(fn, q, k, v,
                       shown=f"q {tuple(q.shape)}, k {tuple(k.shape)}, "
                             f"v {tuple(v.shape)}",
                       explain=_explain_scores(ATTENTION[
                           "k_not_transposed"]))
        if call.verdict is not None:
            return call.verdict
        want = scaled_dot_product_attention(q, k, v)
        wrong = [
            (ATTENTION["unscaled"], partial(_attend, q, k, v, 1.0)),
            (ATTENTION["scaled_by_dk"], partial(_attend, q, k, v, 1 / d)),
            (ATTENTION["scaled_by_dv"],
             partial(_attend, q, k, v, dv ** -0.5)),
            (ATTENTION["scaled_by_length"],
             partial(_attend, q, k, v, lk ** -0.5)),
            (ATTENTION["multiplied"],
             partial(_attend, q, k, v, math.sqrt(d))),
            (ATTENTION["softmax_dim"],
             partial(_attend, q, k, v, d ** -0.5, dim=-2)),
            (ATTENTION["swapped_qk"],
             partial(_attend_swapped, q, k, v, d ** -0.5)),
            (ATTENTION["after_softmax"],
             partial(_attend_after_softmax, q, k, v, d ** -0.5)),
        ]
        problem = _compare_pair(call, want, wrong)
        if problem is None:
            problem = _gradients(call, (q, k, v), want[0],
                                 ATTENTION["no_gradient"])
        if problem is not None:
            return problem
    return Verdict(True, "output and weights as mha_lib's, for self- and "
                         "cross-attention")


TEMPERATURE = catalogue(
    "check_temperature", 6,
    multiplied_by_tau=("the scores are multiplied by tau; a temperature "
                       "divides them: q k^T / (tau sqrt(D))", _SCALE),
    tau_ignored=("tau changes nothing: divide the scores by "
                 "tau * sqrt(D)", _SCALE),
    sqrt_of_tau=("the scale is 1 / sqrt(tau D); it is 1 / (tau sqrt(D)): "
                 "tau outside the square root", _SCALE),
    no_sqrt_d=("the 1 / sqrt(D) is missing: divide by tau * sqrt(D)",
               _SCALE),
    softmax_dim=("the softmax runs over the queries (dim=-2); it runs "
                 "over the keys, the last axis", _SOFTMAX),
)


def check_temperature(
    fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float],
                 tuple[torch.Tensor, torch.Tensor]],
) -> Verdict:
    """Exercise 6.2: ``fn(q, k, v, tau) -> (output, weights)`` with weights
    ``softmax(q k^T / (tau * sqrt(D)))``."""
    q, k, v = _qkv(6, (2, 4), 6, 6, 8, 8)
    d = q.size(-1)
    for tau in (0.25, 3.0, 1.0):
        call = attempt(fn, q, k, v, tau,
                       shown=f"q, k, v {tuple(q.shape)}, tau={tau}",
                       explain=_explain_scores(ATTENTION[
                           "k_not_transposed"]))
        if call.verdict is not None:
            return call.verdict
        scale = 1.0 / (tau * math.sqrt(d))
        want = scaled_dot_product_attention(q, k, v, scale=scale)
        wrong = [
            (TEMPERATURE["multiplied_by_tau"],
             partial(_attend, q, k, v, tau / math.sqrt(d))),
            (TEMPERATURE["tau_ignored"],
             partial(_attend, q, k, v, 1 / math.sqrt(d))),
            (TEMPERATURE["sqrt_of_tau"],
             partial(_attend, q, k, v, 1 / math.sqrt(tau * d))),
            (TEMPERATURE["no_sqrt_d"], partial(_attend, q, k, v, 1 / tau)),
            (TEMPERATURE["softmax_dim"],
             partial(_attend, q, k, v, scale, dim=-2)),
        ]
        problem = _compare_pair(call, want, wrong)
        if problem is not None:
            return problem
    return Verdict(True, "as mha_lib's with scale = 1 / (tau sqrt(D)), "
                         "tau = 0.25, 1, 3")


JACOBIAN = catalogue(
    "check_softmax_jacobian", 6,
    autograd=("that uses autograd; the exercise derives J by hand: "
              "J = diag(p) - p p^T", _SATURATES),
    diagonal_only=("only the diagonal is there: the off-diagonal entries "
                   "are -p_i p_j (J = diag(p) - p p^T)", _SATURATES),
    diagonal_right=("the diagonal p_i (1 - p_i) is right; the off-diagonal "
                    "entries -p_i p_j are missing: J = diag(p) - p p^T",
                    _SATURATES),
    no_diagonal=("only -p p^T is there: the diagonal also has +p_i, "
                 "since d p_i / d s_i = p_i (1 - p_i); J = diag(p) - "
                 "p p^T", _SATURATES),
    sign=("the signs are flipped: J = diag(p) - p p^T", _SATURATES),
    of_scores=("that uses the scores; the Jacobian is in terms of "
               "p = softmax(scores)", _SATURATES),
    elementwise=("p * p is the element-wise square, a vector that "
                 "broadcasts into every row; the second term is the outer "
                 "product p p^T: torch.outer(p, p), or p[:, None] * "
                 "p[None, :]", _SATURATES),
)

def _saved(graph: list, t: torch.Tensor) -> torch.Tensor:
    graph.append(t.shape)
    return t


def _unpacked(t: torch.Tensor) -> torch.Tensor:
    return t


_AUTOGRAD = (torch.Tensor.backward, torch.Tensor.requires_grad_,
             torch.autograd.grad, torch.autograd.backward,
             torch.Tensor.requires_grad.__set__)


def check_softmax_jacobian(
    fn: Callable[[torch.Tensor], torch.Tensor],
) -> Verdict:
    """Exercise 6.3: ``fn(scores) -> J`` with
    ``J[i, j] = d softmax(scores)_i / d scores_j`` for a 1-D ``scores``,
    computed without autograd; compared with autograd's."""
    names = source_names(fn)
    g = torch.Generator().manual_seed(7)
    for scores in (torch.randn(6, generator=g, dtype=torch.float64),
                   20.0 * torch.randn(4, generator=g, dtype=torch.float64)):
        graph: list = []  # tensors autograd saved while fn ran
        with torch.autograd.graph.saved_tensors_hooks(
                partial(_saved, graph), _unpacked):
            call = attempt(fn, scores.clone())
        if call.verdict is not None:
            return call.verdict
        if graph or call.record.used(*_AUTOGRAD) or names & {
                "autograd", "backward", "jacrev", "jacfwd", "vjp", "jvp",
                "requires_grad_"}:
            return JACOBIAN["autograd"].verdict(call.label)
        want = torch.autograd.functional.jacobian(
            lambda s: torch.softmax(s, dim=-1), scores)
        p = torch.softmax(scores, dim=-1)
        problem = check_tensor(
            call.label, call.value, want,
            axes="(n, n)", atol=1e-6, rtol=1e-5, mistakes=[
                (JACOBIAN["diagonal_only"], torch.diag(p)),
                (JACOBIAN["diagonal_right"], torch.diag(p - p * p)),
                (JACOBIAN["sign"], torch.outer(p, p) - torch.diag(p)),
                (JACOBIAN["no_diagonal"], -torch.outer(p, p)),
                (JACOBIAN["of_scores"],
                 torch.diag(scores) - torch.outer(scores, scores)),
                (JACOBIAN["elementwise"], torch.diag(p) - p * p),
                (JACOBIAN["elementwise"], torch.diag(p) - (p * p)[:, None]),
            ])
        if problem is not None:
            return problem
    return Verdict(
        True, "J = diag(p) - p p^T, as autograd's Jacobian of the softmax")
