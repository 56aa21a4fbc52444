"""Checkers for chapter 15's exercises (tiny transformers that reverse
digits and find repeats).

The reversal task: ``N = 6`` digits (ids 0-9), the separator ``SEP = 10``,
then the answer, so a sequence has ``2 * N + 1 = 13`` tokens. The
induction task: ``k`` distinct tokens, repeated once.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torch.nn.functional as F

from mha_lib.exercises.verdict import Verdict, close
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


def check_copy_batch(
    fn: Callable[[int, torch.Generator], torch.Tensor],
) -> Verdict:
    """Exercise 15.1: ``fn(batch_size, generator)`` returns
    ``(batch_size, 13)`` int64 sequences ``digits, SEP, digits`` (the copy
    task) with random digits from ``generator``."""
    try:
        seq = fn(200, torch.Generator().manual_seed(14))
    except Exception as error:
        # the reader's code: report it, do not crash the notebook
        return Verdict(
            False,
            f"fn(200, generator) raised {type(error).__name__}: {error}")
    if not isinstance(seq, torch.Tensor) or seq.dtype != torch.long:
        return Verdict(
            False, f"fn(200, generator) should be an int64 tensor, got "
                   f"{getattr(seq, 'dtype', type(seq).__name__)}")
    if tuple(seq.shape) != (200, 2 * N + 1):
        return Verdict(
            False, f"fn(200, generator) should have shape "
                   f"(200, {2 * N + 1}), got {tuple(seq.shape)}")
    digits, sep, answer = seq[:, :N], seq[:, N], seq[:, N + 1:]
    if not bool((sep == SEP).all()):
        return Verdict(
            False,
            f"position {N} should be the separator {SEP} in every row")
    if not bool(((digits >= 0) & (digits <= 9)).all()):
        return Verdict(False, "the first 6 tokens should be digits 0-9")
    if (torch.equal(answer, digits.flip(1))
            and not torch.equal(answer, digits)):
        return Verdict(
            False, "this is the reversal task of the chapter; copy the "
                   "digits in the same order")
    if not torch.equal(answer, digits):
        return Verdict(
            False, "the last 6 tokens should repeat the first 6 in order")
    if (len({tuple(row) for row in digits.tolist()}) < 190
            or digits.unique().numel() != 10):
        return Verdict(
            False, "the digits should be random (use the generator), "
                   "every digit from 0 to 9")
    again = fn(200, torch.Generator().manual_seed(14))
    if not torch.equal(again, seq):
        return Verdict(
            False, "the same generator seed should give the same batch: "
                   "draw the digits with "
                   "torch.randint(..., generator=generator)")
    return Verdict(
        True, "digits, separator, the same digits: query N + j must read "
              f"key j, a diagonal {N} positions below the main one")


def _answer_loss(logits: torch.Tensor, seq: torch.Tensor) -> torch.Tensor:
    vocab = logits.size(-1)
    return F.cross_entropy(logits[:, N:].reshape(-1, vocab),
                           seq[:, N + 1:].reshape(-1))


def check_answer_loss(
    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> Verdict:
    """Exercise 15.2: ``fn(logits, seq)`` is the mean cross-entropy of the
    answer tokens: ``logits`` ``(B, 2N, V)`` come from
    ``model(seq[:, :-1])``, ``seq`` is ``(B, 2N+1)``."""
    generator = torch.Generator().manual_seed(141)
    seq = torch.cat([torch.randint(10, (5, N), generator=generator),
                     torch.full((5, 1), SEP),
                     torch.randint(10, (5, N), generator=generator)],
                    dim=1)
    logits = torch.randn(5, 2 * N, 11, generator=generator)
    expected = _answer_loss(logits, seq)
    try:
        given = fn(logits, seq)
    except Exception as error:
        # the reader's code: report it, do not crash the notebook
        return Verdict(
            False,
            f"fn(logits, seq) raised {type(error).__name__}: {error}")
    if isinstance(given, torch.Tensor) and given.shape == ():
        everything = F.cross_entropy(logits.reshape(-1, 11),
                                     seq[:, 1:].reshape(-1))
        if torch.allclose(given, everything):
            return Verdict(
                False, "this averages over every position; the digits "
                       "before the separator are random and cannot be "
                       "predicted: score only the answer")
        shifted = F.cross_entropy(logits[:, N + 1:].reshape(-1, 11),
                                  seq[:, N + 2:].reshape(-1))
        unshifted = F.cross_entropy(logits[:, N:].reshape(-1, 11),
                                    seq[:, N:-1].reshape(-1))
        if (torch.allclose(given, shifted)
                or torch.allclose(given, unshifted)):
            return Verdict(
                False, "off by one: the logits at position t predict "
                       f"token t + 1, so logits[:, {N}:] go with "
                       f"seq[:, {N + 1}:]")
    return close("fn(logits, seq)", given, expected,
                 f"logits[:, {N}:] (the separator and the answer so far) "
                 f"predict seq[:, {N + 1}:], the answer")


def check_remove_head(
    fn: Callable[[TinyTransformer, int], None],
) -> Verdict:
    """Exercise 15.3: ``fn(model, head)`` silences ``head`` in every block
    of ``model``, in place, by zeroing the columns of ``out_proj.weight``
    that multiply that head."""
    torch.manual_seed(143)
    model = TinyTransformer(11, 16, 4, num_layers=2, max_len=13).eval()
    idx = torch.randint(11, (3, 13),
                        generator=torch.Generator().manual_seed(143))
    for head in (0, 2):
        expected_model = copy.deepcopy(model)
        rows_model = copy.deepcopy(model)
        with torch.no_grad():
            for e, r in zip(expected_model.blocks, rows_model.blocks,
                            strict=True):
                d = e.attn.head_dim
                e.attn.out_proj.weight[:, head * d:(head + 1) * d] = 0.0
                r.attn.out_proj.weight[head * d:(head + 1) * d] = 0.0
            expected = expected_model(idx)
            wrong_rows = rows_model(idx)
        given_model = copy.deepcopy(model)
        try:
            with torch.no_grad():
                fn(given_model, head)
                given = given_model(idx)
        except Exception as error:
            # the reader's code: report it, do not crash the notebook
            return Verdict(
                False,
                f"fn(model, {head}) raised {type(error).__name__}: {error}")
        if torch.allclose(given, wrong_rows):
            return Verdict(
                False, "these are rows of out_proj.weight (output "
                       "features); nn.Linear stores W transposed, so "
                       "head h's inputs are its columns")
        verdict = close(f"the logits after fn(model, {head})", given,
                        expected, "")
        if not verdict:
            return verdict
    return Verdict(
        True, "out_proj.weight[:, h*D:(h+1)*D] = 0 removes head h's term "
              "from the sum over heads (chapter 8)")


def _planted_weights(generator: torch.Generator, roles: dict,
                     num_layers: int, num_heads: int, k: torch.Tensor,
                     length: int) -> torch.Tensor:
    """Causal weights ``(N, B, H, L, L)``: random rows, except the heads in
    ``roles`` ({(layer, head): offset}) whose queries in the second copy put
    most weight on key ``t - k + offset`` (1: induction, 0: the earlier
    twin itself) or, for offset None, on the previous token."""
    batch = k.size(0)
    scores = torch.randn(num_layers, batch, num_heads, length, length,
                         generator=generator)
    q = torch.arange(length)  # (L,)
    for (layer, head), offset in roles.items():
        if offset is None:
            target = (q - 1).clamp(min=0).expand(batch, length)  # (B, L)
        else:
            second = (q >= k) & (q < 2 * k - 1)  # (B, L)
            target = torch.where(second, q - k + offset,
                                 torch.zeros_like(q))  # (B, L)
        bonus = torch.zeros(batch, length, length)
        bonus.scatter_(2, target[..., None], 6.0)
        scores[layer, :, head] += bonus
    allowed = torch.ones(length, length, dtype=torch.bool).tril()
    return scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)


def check_find_induction_head(
    fn: Callable[[torch.Tensor, torch.Tensor], tuple[int, int]],
) -> Verdict:
    """Exercise 15.4: ``fn(weights, k)`` returns ``(layer, head)`` of the
    induction head, for attention weights ``(N, B, H, L, L)`` (as
    ``model(idx, need_weights=True)`` returns them) of sequences whose
    first ``k`` tokens repeat once (``k`` is ``(B, 1)``)."""
    generator = torch.Generator().manual_seed(154)
    length = 23
    for num_layers, num_heads, induction, previous, twin in (
            (2, 3, (1, 2), (0, 1), (1, 0)),
            (3, 2, (2, 0), (1, 1), (0, 0)),
            (2, 4, (1, 1), (0, 3), (1, 3))):
        k = torch.randint(6, 12, (40, 1), generator=generator)
        roles = {induction: 1, previous: None, twin: 0}
        weights = _planted_weights(generator, roles, num_layers, num_heads,
                                   k, length)
        try:
            given = fn(weights, k)
        except Exception as error:
            # the reader's code: report it, do not crash the notebook
            return Verdict(
                False, f"fn(weights, k) raised {type(error).__name__}: "
                       f"{error}")
        try:
            given = tuple(int(i) for i in given)
        except (TypeError, ValueError):
            return Verdict(False, f"fn(weights, k) should return a pair "
                                  f"(layer, head), got {given!r}")
        if given == previous:
            return Verdict(
                False, f"{given} is a previous-token head: it looks one "
                       f"step back everywhere; the induction head looks "
                       f"k - 1 steps back, in the second copy only")
        if given == twin:
            return Verdict(
                False, f"{given} looks at the earlier twin itself "
                       f"(key t - k); the induction head looks at the "
                       f"token after it, key t - k + 1")
        if given != induction:
            return Verdict(
                False, f"fn(weights, k) should be {induction} for weights "
                       f"of shape {tuple(weights.shape)}, got {given}")
    return Verdict(
        True, "score each head by its mean weight on key t - k + 1 over "
              "the queries of the second copy; the best is the induction "
              "head")
