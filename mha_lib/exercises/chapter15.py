"""Checkers for chapter 15's exercises (tiny transformers that reverse
digits and find repeats).

The reversal task: ``N = 6`` digits (ids 0-9), the separator ``SEP = 10``,
then the answer, so a sequence has ``2 * N + 1 = 13`` tokens. The
induction task: ``k`` distinct tokens, repeated once.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

from mha_lib.exercises.verdict import (
    Verdict,
    attempt,
    catalogue,
    check_tensor,
)
from mha_lib.model import TinyTransformer

__all__ = [
    "N",
    "SEP",
    "check_copy_batch",
    "check_answer_loss",
    "check_remove_head",
    "check_find_induction_head",
]

N = 6  # digits per sequence
SEP = 10  # the separator token

_TASK = "Reversal: one layer that looks by position"
_LOOP = "The model, the loss and the training loop"
_ABLATIONS = "Two heads, one job: ablations"

COPY = catalogue(
    "check_copy_batch", 15,
    reversed=("this is the reversal task of the chapter; copy the digits "
              "in the same order", _TASK),
    no_separator=(f"position {N} should be the separator {SEP} in every "
                  f"row: digits, separator, digits, {2 * N + 1} tokens",
                  _TASK),
    separator_as_digit=(f"the digits are 0-9; the separator {SEP} is not "
                        f"one of them: torch.randint(10, ...)", _TASK),
    fresh_answer=(f"the last {N} tokens should repeat the first {N}: draw "
                  f"the digits once and use them twice", _TASK),
    not_random=("the digits should be random (drawn from the generator), "
                "every digit from 0 to 9", _TASK),
    generator_ignored=("the same generator seed should give the same "
                       "batch: draw the digits with torch.randint(..., "
                       "generator=generator)", _TASK),
)


def check_copy_batch(
    fn: Callable[[int, torch.Generator], torch.Tensor],
) -> Verdict:
    """Exercise 15.1: ``fn(batch_size, generator)`` returns
    ``(batch_size, 13)`` int64 sequences ``digits, SEP, digits`` (the copy
    task) with random digits from ``generator``."""
    with torch.random.fork_rng():  # the global state must not matter
        call = attempt(fn, 200, torch.Generator().manual_seed(14),
                       shown="200, generator")
    if call.verdict is not None:
        return call.verdict
    seq = call.value
    if not isinstance(seq, torch.Tensor) or seq.dtype != torch.long:
        return Verdict(
            False, f"{call.label} should be an int64 tensor, got "
                   f"{getattr(seq, 'dtype', type(seq).__name__)}")
    if tuple(seq.shape) == (200, 2 * N):  # digits and digits, no SEP
        return COPY["no_separator"].verdict(call.label)
    if tuple(seq.shape) != (200, 2 * N + 1):
        return Verdict(
            False, f"{call.label}: expected shape (batch_size, 2N + 1) = "
                   f"(200, {2 * N + 1}), got {tuple(seq.shape)}")
    digits, sep, answer = seq[:, :N], seq[:, N], seq[:, N + 1:]
    if not bool((sep == SEP).all()):
        return COPY["no_separator"].verdict(call.label)
    if bool((digits == SEP).any()):
        return COPY["separator_as_digit"].verdict(call.label)
    if not bool(((digits >= 0) & (digits <= 9)).all()):
        return Verdict(False, f"{call.label}: the first {N} tokens should "
                              f"be digits 0-9")
    if (torch.equal(answer, digits.flip(1))
            and not torch.equal(answer, digits)):
        return COPY["reversed"].verdict(call.label)
    if not torch.equal(answer, digits):
        return COPY["fresh_answer"].verdict(call.label)
    if (len({tuple(row) for row in digits.tolist()}) < 190
            or digits.unique().numel() != 10):
        return COPY["not_random"].verdict(call.label)
    with torch.random.fork_rng():
        torch.manual_seed(1)  # another global state, the same generator
        again = attempt(fn, 200, torch.Generator().manual_seed(14),
                        shown="200, generator")
    if again.verdict is not None:
        return again.verdict
    if not isinstance(again.value, torch.Tensor) \
            or not torch.equal(again.value, seq):
        return COPY["generator_ignored"].verdict(call.label)
    return Verdict(
        True, "digits, separator, the same digits: query N + j must read "
              f"key j, a diagonal {N} positions below the main one")


LOSS = catalogue(
    "check_answer_loss", 15,
    all_positions=("this averages over every position; the digits before "
                   "the separator are random and cannot be predicted: "
                   "score only the answer", _LOOP),
    off_by_one=(f"off by one: the logits at position t predict token "
                f"t + 1, so logits[:, {N}:] go with seq[:, {N + 1}:]",
                _LOOP),
    with_separator=("the separator is not part of the answer: score the "
                    f"{N} answer tokens, seq[:, {N + 1}:]", _LOOP),
    summed=("that is the sum; the loss is the mean over the answer "
            "tokens (cross_entropy's default)", _LOOP),
    softmax_first=("F.cross_entropy takes raw logits and applies "
                   "log_softmax itself: a softmax before it turns the "
                   "logits into probabilities, which it then softmaxes "
                   "again; pass the logits as they are",
                   _LOOP),
    nll_on_logits=("F.nll_loss expects log-probabilities (it only picks "
                   "and negates the target's entry), not logits or "
                   "probabilities: use F.cross_entropy, which applies "
                   "log_softmax itself (or log_softmax them first)", _LOOP),
    not_a_tensor=("return the loss as a tensor: .item() (or float) cuts "
                  "it off from the graph, and training needs its "
                  "gradient", _LOOP),
    unflattened=("F.cross_entropy reads dimension 1 as the classes: "
                 "(B, N, V) logits need .flatten(0, 1) (and the targets "
                 ".flatten()), or .transpose(1, 2) to (B, V, N)", _LOOP),
)


def _explain_loss(error: BaseException, record) -> object:
    text = str(error)
    return LOSS["unflattened"] if "Expected target size" in text \
        or "Expected input batch_size" in text else None


def _answer_loss(logits: torch.Tensor, seq: torch.Tensor,
                 first: int = N, target: int = N + 1,
                 reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of ``logits[:, first:]`` against ``seq[:, target:]``
    (the right answer with the defaults), cut to the same length."""
    count = min(logits.size(1) - first, seq.size(1) - target)
    vocab = logits.size(-1)
    return F.cross_entropy(
        logits[:, first:first + count].reshape(-1, vocab),
        seq[:, target:target + count].reshape(-1), reduction=reduction)


def check_answer_loss(
    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> Verdict:
    """Exercise 15.2: ``fn(logits, seq)`` is the mean cross-entropy of the
    answer tokens: ``logits`` ``(B, 2N, V)`` come from
    ``model(seq[:, :-1])``, ``seq`` is ``(B, 2N+1)``; its gradient trains
    the model."""
    generator = torch.Generator().manual_seed(141)
    seq = torch.cat([torch.randint(10, (5, N), generator=generator),
                     torch.full((5, 1), SEP),
                     torch.randint(10, (5, N), generator=generator)],
                    dim=1)
    logits = torch.randn(5, 2 * N, 11, generator=generator,
                         requires_grad=True)
    expected = _answer_loss(logits, seq)
    call = attempt(fn, logits, seq, explain=_explain_loss)
    if call.verdict is not None:
        return call.verdict
    given = call.value
    if not isinstance(given, torch.Tensor):
        return LOSS["not_a_tensor"].verdict(call.label)
    vocab = logits.size(-1)
    problem = check_tensor(call.label, given, expected, axes="()",
                           mistakes=[
        (LOSS["all_positions"], lambda: F.cross_entropy(
            logits.reshape(-1, vocab), seq[:, 1:].reshape(-1))),
        (LOSS["off_by_one"], lambda: _answer_loss(logits, seq, N + 1,
                                                  N + 2)),
        (LOSS["off_by_one"], lambda: _answer_loss(logits, seq, N, N)),
        (LOSS["with_separator"], lambda: _answer_loss(logits, seq, N - 1,
                                                      N)),
        (LOSS["summed"], lambda: _answer_loss(logits, seq,
                                              reduction="sum")),
        (LOSS["softmax_first"], lambda: F.cross_entropy(
            logits[:, N:].softmax(-1).reshape(-1, vocab),
            seq[:, N + 1:].reshape(-1))),
        (LOSS["nll_on_logits"], lambda: F.nll_loss(
            logits[:, N:].reshape(-1, vocab), seq[:, N + 1:].reshape(-1))),
        (LOSS["nll_on_logits"], lambda: F.nll_loss(  # on probabilities
            logits[:, N:].softmax(-1).reshape(-1, vocab),
            seq[:, N + 1:].reshape(-1))),
    ])
    if problem is not None:
        return problem
    if not given.requires_grad:
        return LOSS["not_a_tensor"].verdict(call.label)
    (got,) = torch.autograd.grad(given, logits)
    (want,) = torch.autograd.grad(expected, logits)
    if not torch.allclose(got, want, atol=1e-6):
        return Verdict(False, f"the gradient of {call.label} differs from "
                              f"the loss's")
    return Verdict(True,
                   f"logits[:, {N}:] (the separator and the answer so far) "
                   f"predict seq[:, {N + 1}:], the answer")


REMOVE = catalogue(
    "check_remove_head", 15,
    rows=("these are rows of out_proj.weight (output features); nn.Linear "
          "stores W transposed, so head h's inputs are its columns",
          _ABLATIONS),
    not_in_place=("the model passed in did not change: change it in "
                  "place (a copy, or a new model returned, leaves it as "
                  "it was)", _ABLATIONS),
    first_block=("only one block lost the head: silence it in every block "
                 "of model.blocks", _ABLATIONS),
    query_rows=("zeroing the head's query projection only changes where "
                "it looks (evenly, or by q_proj.bias alone), and it still "
                "writes its values: zero its columns of out_proj.weight",
                _ABLATIONS),
    out_bias=("out_proj.bias belongs to no head (it is added once, after "
              "the heads' terms are summed): leave it, and zero only the "
              "head's columns of out_proj.weight", _ABLATIONS),
    value_bias=("zeroing the head's rows of v_proj.weight leaves its "
                "value bias: the head still writes v_proj.bias (its "
                "weights sum to 1); zero its columns of out_proj.weight",
                _ABLATIONS),
    no_grad=("the weights require gradients, so an in-place change needs "
             "torch.no_grad() around it", _ABLATIONS),
)


def _explain_remove(error: BaseException, record) -> object:
    return REMOVE["no_grad"] if "requires grad" in str(error) else None


def _silenced(model: TinyTransformer, head: int, where: str,
              blocks: slice = slice(None)) -> TinyTransformer:
    """A copy of ``model`` with ``head`` zeroed in one of several ways."""
    model = copy.deepcopy(model)
    with torch.no_grad():
        for block in list(model.blocks)[blocks]:
            d = block.attn.head_dim
            part = slice(head * d, (head + 1) * d)
            if where == "columns":
                block.attn.out_proj.weight[:, part] = 0.0
            elif where == "rows":
                block.attn.out_proj.weight[part] = 0.0
            elif where == "values":
                block.attn.v_proj.weight[part] = 0.0
            elif where == "columns_and_bias":
                block.attn.out_proj.weight[:, part] = 0.0
                block.attn.out_proj.bias.zero_()
            elif where == "query_weight":
                block.attn.q_proj.weight[part] = 0.0
            else:
                block.attn.q_proj.weight[part] = 0.0
                block.attn.q_proj.bias[part] = 0.0
    return model


def _logits(model: TinyTransformer, idx: torch.Tensor, head: int,
            where: str, blocks: slice = slice(None)) -> torch.Tensor:
    with torch.no_grad():
        return _silenced(model, head, where, blocks)(idx)


def check_remove_head(
    fn: Callable[[TinyTransformer, int], None],
) -> Verdict:
    """Exercise 15.3: ``fn(model, head)`` silences ``head`` in every block
    of ``model``, in place, by zeroing the columns of ``out_proj.weight``
    that multiply that head (called as a reader calls it, with gradients
    on)."""
    with torch.random.fork_rng():  # leave the reader's random state alone
        torch.manual_seed(143)
        model = TinyTransformer(11, 16, 4, num_layers=2, max_len=13).eval()
    idx = torch.randint(11, (3, 13),
                        generator=torch.Generator().manual_seed(143))
    with torch.no_grad():
        before = model(idx)
    for head in (0, 2):
        given_model = copy.deepcopy(model)
        call = attempt(fn, given_model, head, shown=f"model, {head}",
                       explain=_explain_remove)
        if call.verdict is not None:
            return call.verdict
        with torch.no_grad():
            given = given_model(idx)
            expected = _silenced(model, head, "columns")(idx)
        if torch.allclose(given, before):
            return REMOVE["not_in_place"].verdict(call.label)
        logits = partial(_logits, model, idx, head)
        problem = check_tensor(
            f"the logits after {call.label}", given, expected, mistakes=[
                (REMOVE["rows"], partial(logits, "rows")),
                (REMOVE["first_block"],
                 partial(logits, "columns", slice(0, 1))),
                (REMOVE["first_block"],
                 partial(logits, "columns", slice(1, 2))),
                (REMOVE["query_rows"], partial(logits, "query")),
                (REMOVE["query_rows"], partial(logits, "query_weight")),
                (REMOVE["out_bias"], partial(logits, "columns_and_bias")),
                (REMOVE["value_bias"], partial(logits, "values")),
            ])
        if problem is not None:
            return problem
    return Verdict(
        True, "out_proj.weight[:, h*D:(h+1)*D] = 0 removes head h's term "
              "from the sum over heads (chapter 8)")


def _planted_weights(generator: torch.Generator, roles: dict,
                     num_layers: int, num_heads: int, k: torch.Tensor,
                     length: int) -> torch.Tensor:
    """Causal weights ``(layers, B, H, L, L)``: random rows, except the
    heads in ``roles`` ({(layer, head): offset}) whose queries in the
    second copy put most weight on key ``t - k + offset`` (1: induction,
    0: the earlier twin itself) or, for offset None, on the previous
    token; offset "first": induction with the first sequence's k in every
    sequence; offset "outside": key ``max(t - k + 1, 0)`` for every query
    *outside* the second copy (the first token, in the first copy), the
    query itself inside it."""
    batch = k.size(0)
    scores = torch.randn(num_layers, batch, num_heads, length, length,
                         generator=generator)
    q = torch.arange(length)  # (L,)
    for (layer, head), offset in roles.items():
        if offset is None:
            target = (q - 1).clamp(min=0).expand(batch, length)  # (B, L)
        elif offset == "outside":
            second = (q >= k) & (q < 2 * k - 1)  # (B, L)
            target = torch.where(second, q, (q - k + 1).clamp(min=0))
        elif offset == "first":
            k0 = k[:1]  # (1, 1): the first sequence's k, for every one
            second = (q >= k0) & (q < 2 * k0 - 1)  # (1, L)
            target = torch.where(second, q - k0 + 1, torch.zeros_like(q))
            target = target.expand(batch, length)  # (B, L)
        else:
            second = (q >= k) & (q < 2 * k - 1)  # (B, L)
            target = torch.where(second, q - k + offset,
                                 torch.zeros_like(q))  # (B, L)
        bonus = torch.zeros(batch, length, length)
        bonus.scatter_(2, target[..., None], 6.0)
        scores[layer, :, head] += bonus
    allowed = torch.ones(length, length, dtype=torch.bool).tril()
    return scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)


_INDUCTION = "The two heads in the trained model"

INDUCTION = catalogue(
    "check_find_induction_head", 15,
    previous_token=("that is a previous-token head: it looks one step "
                    "back everywhere; the induction head looks k - 1 steps "
                    "back, in the second copy only", _INDUCTION),
    twin=("that head looks at the earlier twin itself: scoring key "
          "t - k is one too early; the induction head looks at the token "
          "after the twin, key t - k + 1", _INDUCTION),
    all_queries=("that head looks at key t - k + 1 (clamped to 0: the "
                 "first token) only outside the second copy; score only "
                 "the queries of the second copy, k <= t < 2k - 1",
                 _INDUCTION),
    swapped=("the pair is (layer, head), in that order: divmod(index, H) "
             "of the flattened (layers, H) scores", _INDUCTION),
    first_k=("that head looks back by the first sequence's k in every "
             "sequence: k is (B, 1), one k per sequence; score the "
             "queries of sequence b with k[b]", _INDUCTION),
    one_based=("the layer index is off by one: model.blocks and the "
               "weights' first axis count from 0, so the second layer is "
               "layer 1", _INDUCTION),
    random_head=("that head's weights are random: score each head by its "
                 "weight on key t - k + 1 over the queries of the second "
                 "copy", _INDUCTION),
)


def check_find_induction_head(
    fn: Callable[[torch.Tensor, torch.Tensor], tuple[int, int]],
) -> Verdict:
    """Exercise 15.4: ``fn(weights, k)`` returns ``(layer, head)`` of the
    induction head, for attention weights ``(layers, B, H, L, L)`` (as
    ``model(idx, need_weights=True)`` returns them) of sequences whose
    first ``k`` tokens repeat once (``k`` is ``(B, 1)``)."""
    generator = torch.Generator().manual_seed(154)
    length = 23
    for (num_layers, num_heads, induction, previous, twin, first,
         outside) in (
            (2, 3, (1, 2), (0, 1), (1, 0), (0, 2), (1, 1)),
            (3, 2, (2, 0), (1, 1), (0, 0), (0, 1), (1, 0)),
            (2, 4, (1, 1), (0, 3), (1, 3), (0, 1), (1, 2))):
        k = torch.randint(6, 12, (40, 1), generator=generator)
        roles = {induction: 1, previous: None, twin: 0, first: "first",
                 outside: "outside"}
        weights = _planted_weights(generator, roles, num_layers, num_heads,
                                   k, length)
        call = attempt(fn, weights, k, shown=f"weights "
                                             f"{tuple(weights.shape)}, k")
        if call.verdict is not None:
            return call.verdict
        try:
            given = tuple(int(i) for i in call.value)
        except (TypeError, ValueError):
            given = None
        if given is None or len(given) != 2:
            return Verdict(False, f"{call.label} should return a pair "
                                  f"(layer, head), got {call.value!r}")
        one_based = (induction[0] + 1, induction[1])
        for mistake, head in (("previous_token", previous), ("twin", twin),
                              ("swapped", induction[::-1]),
                              ("first_k", first),
                              ("all_queries", outside),
                              ("one_based", one_based),
                              ("one_based", (one_based[0],
                                             one_based[1] + 1))):
            if given == head and given != induction:
                return INDUCTION[mistake].verdict(f"{call.label} = {given}")
        if given != induction:
            return INDUCTION["random_head"].verdict(
                f"{call.label} = {given}")
    return Verdict(
        True, "score each head by its mean weight on key t - k + 1 over "
              "the queries of the second copy; the best is the induction "
              "head")
