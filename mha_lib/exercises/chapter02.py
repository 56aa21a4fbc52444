"""Checkers for chapter 2's exercises (embeddings)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from mha_lib.exercises.verdict import (
    MATMUL,
    SENTENCES,
    Verdict,
    attempt,
    catalogue,
    check_number,
    check_tensor,
    indexes_with_tensor,
)
from mha_lib.text import build_vocab, encode

__all__ = [
    "check_onehot_embedding",
    "check_padding_embedding",
    "check_embedding_parameters",
]

ONEHOT = catalogue(
    "check_onehot_embedding", 2,
    indexing=("that looks the rows up by indexing (or F.embedding); the "
              "exercise asks for F.one_hot and a matrix product",
              "An embedding is a lookup"),
    no_num_classes=("F.one_hot(ids) without num_classes makes ids.max() "
                    "+ 1 columns, not one per row of the table: pass "
                    "num_classes=weight.size(0)",
                    "An embedding is a lookup"),
    not_cast=("F.one_hot returns int64; cast it to the table's dtype "
              "before the product (.to(weight.dtype))",
              "An embedding is a lookup"),
    no_gradient=("no gradient reaches weight, so the table could not be "
                 "trained: no .detach(), .data or torch.no_grad() on the "
                 "way", "Only the rows used get a gradient"),
    no_one_hot=("the exercise asks for F.one_hot and a matrix product; "
                "this does not call F.one_hot", "An embedding is a lookup"),
    classes_d_model=("num_classes is weight.size(1), d_model; a one-hot "
                     "vector has one entry per row of the table, per "
                     "token: num_classes=weight.size(0)",
                     "An embedding is a lookup"),
    flattened=("the numbers are right but the axes of ids are gone: the "
               "result should have shape ids.shape + (d_model,); F.one_hot "
               "keeps the axes of ids and adds one, so do not flatten ids "
               "(or view the result back to (*ids.shape, d_model))",
               "An embedding is a lookup"),
    wrong_rows=("the shape is right but the numbers are not the rows of "
                "weight that ids pick: multiply the one-hot rows, "
                "F.one_hot(ids, num_classes=weight.size(0)) cast to "
                "weight's dtype, by weight itself, unchanged",
                "An embedding is a lookup"),
    transposed=("weight is already (V, d_model), one row per token: "
                "multiply by weight, not weight.T (nn.Linear stores its "
                "matrix transposed; nn.Embedding does not)",
                "An embedding is a lookup"),
)


def _flattened(given: object, expected: torch.Tensor) -> bool:
    """The right numbers in another shape (ids flattened, or the result)."""
    if (not isinstance(given, torch.Tensor) or given.shape == expected.shape
            or given.numel() != expected.numel()):
        return False
    reshaped = given.detach().reshape(expected.shape).float()
    return torch.allclose(reshaped, expected.detach().float(), atol=1e-5)


def _one_hot_without_classes(record) -> bool:
    for _, args, kwargs in record.find(F.one_hot):
        classes = args[1] if len(args) > 1 else kwargs.get("num_classes",
                                                           -1)
        if classes == -1:
            return True
    return False


def _explain_onehot(error: BaseException, record,
                    weight: torch.Tensor) -> object:
    if _one_hot_without_classes(record):
        return ONEHOT["no_num_classes"]
    for _, args, kwargs in record.find(F.one_hot):
        classes = args[1] if len(args) > 1 else kwargs.get("num_classes")
        if classes == weight.size(1) != weight.size(0):
            return ONEHOT["classes_d_model"]
    transposed = tuple(reversed(weight.shape))
    if any(isinstance(a, torch.Tensor) and tuple(a.shape) == transposed
           and a.dim() == 2 for _, args, _ in record.calls for a in args
           if a is not weight) and record.used(F.one_hot):
        return ONEHOT["transposed"]
    text = str(error)
    if record.used(F.one_hot) and any(
            word in text for word in ("dtype", "Long", "scalar type")):
        return ONEHOT["not_cast"]
    return None


def check_onehot_embedding(
    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> Verdict:
    """Exercise 2.1: ``fn(ids, weight)`` computes the embedding lookup as
    one-hot @ weight, for ``ids`` of any shape, with gradients reaching
    ``weight``."""
    generator = torch.Generator().manual_seed(2)
    # the first case never uses the last rows, so a one-hot without
    # num_classes is too narrow; the last table is float64, so a one-hot
    # cast with .float() instead of to weight's dtype fails there
    for shape, vocab_size, d_model, top, dtype in (
            ((3, 6), 14, 8, 10, torch.float32),
            ((2, 5), 30, 4, 30, torch.float32),
            ((7,), 5, 3, 5, torch.float32),
            ((2, 2, 3), 9, 5, 9, torch.float32),
            ((2, 4), 6, 3, 6, torch.float64)):
        ids = torch.randint(top, shape, generator=generator)
        weight = torch.randn(vocab_size, d_model, generator=generator,
                             dtype=dtype, requires_grad=True)
        call = attempt(fn, ids, weight, shown=f"ids {tuple(shape)}, "
                       f"weight {(vocab_size, d_model)} "
                       f"{str(dtype).removeprefix('torch.')}",
                       explain=lambda error, record, w=weight:
                       _explain_onehot(error, record, w))
        if call.verdict is not None:
            return call.verdict
        if any(indexes_with_tensor(c) for c in call.record.calls) \
                or call.record.used(F.embedding, torch.index_select,
                                    torch.Tensor.index_select,
                                    torch.gather, torch.Tensor.gather,
                                    torch.take, torch.take_along_dim):
            return ONEHOT["indexing"].verdict(call.label)
        if not call.record.used(F.one_hot):
            return ONEHOT["no_one_hot"].verdict(call.label)
        if _one_hot_without_classes(call.record):
            return ONEHOT["no_num_classes"].verdict(call.label)
        expected = F.embedding(ids, weight)
        if _flattened(call.value, expected):
            return ONEHOT["flattened"].verdict(call.label)
        problem = check_tensor(call.label, call.value, expected,
                               axes="(..., d_model)")
        given = call.value
        if problem is not None and isinstance(given, torch.Tensor) \
                and given.shape == expected.shape \
                and given.dtype == expected.dtype:
            return ONEHOT["wrong_rows"].verdict(call.label)
        if problem is not None:
            return problem
        if not call.record.used(*MATMUL):
            return ONEHOT["no_one_hot"].verdict(call.label)
        given = call.value
        if not given.requires_grad:
            return ONEHOT["no_gradient"].verdict(call.label)
        (grad,) = torch.autograd.grad(given.sum(), weight)
        (want,) = torch.autograd.grad(expected.sum(), weight)
        if not torch.allclose(grad, want, atol=1e-5):
            return ONEHOT["no_gradient"].verdict(call.label)
    return Verdict(
        True, "one-hot rows @ the table pick the rows nn.Embedding picks")


PADDING = catalogue(
    "check_padding_embedding", 2,
    no_padding_idx=("row 0 of the table (the <pad> vector) is not zero: "
                    "create the embedding with padding_idx=0",
                    "A zero vector for `\"<pad>\"`: `padding_idx`"),
    zeroed_by_hand=("row 0 is zero, but without padding_idx its gradient "
                    "is not, so training moves it again: pass "
                    "padding_idx=0", "A zero vector for `\"<pad>\"`: "
                                     "`padding_idx`"),
    vocab_without_pad=("num_embeddings is the size of the vocabulary "
                       "without \"<pad>\": the table needs a row for it "
                       "too", "A zero vector for `\"<pad>\"`: "
                              "`padding_idx`"),
    pad_id_other=("padding_idx should be the id of \"<pad>\", 0: "
                  "specials get the first ids, so <pad> is row 0, not "
                  "the last row", "A zero vector for `\"<pad>\"`: "
                                  "`padding_idx`"),
    pad_id_word=("padding_idx should be the id of \"<pad>\", 0: the row "
                 "given belongs to a word, whose vector would be zeros and "
                 "never learn, while <pad>'s row trains; build_vocab gives "
                 "the specials the first ids",
                 "A zero vector for `\"<pad>\"`: `padding_idx`"),
    three_sentences=("vectors should embed the padded batch of four: the "
                     "three sentences and \"What is next?\"",
                     "A zero vector for `\"<pad>\"`: `padding_idx`"),
    flattened=("vectors has the right numbers but lost the (B, L) axes "
               "of the batch: embedding(ids) on the (4, 6) ids gives "
               "(4, 6, 8) directly, with no flatten or view",
               "A zero vector for `\"<pad>\"`: `padding_idx`"),
    other_table=("vectors were not made by this embedding: pass the "
                 "padded ids through the same module",
                 "A zero vector for `\"<pad>\"`: `padding_idx`"),
)


def check_padding_embedding(
    embedding: nn.Embedding, vectors: torch.Tensor
) -> Verdict:
    """Exercise 2.2: an embedding for the vocabulary with ``"<pad>"`` (id 0)
    whose pad vector is zero and stays zero in training, and ``vectors``,
    the padded batch of chapter 1 embedded with it."""
    stoi = build_vocab(SENTENCES, specials=("<pad>",))
    if not isinstance(embedding, nn.Embedding):
        return Verdict(False, "embedding should be an nn.Embedding, "
                              f"got {type(embedding).__name__}")
    if embedding.num_embeddings == len(stoi) - 1:
        return PADDING["vocab_without_pad"].verdict("embedding")
    if embedding.num_embeddings != len(stoi):
        return Verdict(False, "embedding.num_embeddings should be the size "
                              "of the vocabulary with \"<pad>\", got "
                              f"{embedding.num_embeddings}")
    if embedding.embedding_dim != 8:
        return Verdict(False, f"embedding.embedding_dim should be d_model "
                              f"= 8, got {embedding.embedding_dim}")
    row_zero = embedding.weight[0].abs().sum().item() == 0.0
    if embedding.padding_idx is None:
        return PADDING["zeroed_by_hand" if row_zero
                       else "no_padding_idx"].verdict("embedding")
    if embedding.padding_idx != 0:
        idx = embedding.padding_idx % len(stoi)
        if idx == len(stoi) - 1:
            return PADDING["pad_id_other"].verdict(
                f"embedding.padding_idx = {embedding.padding_idx}")
        word = {i: w for w, i in stoi.items()}[idx]
        return PADDING["pad_id_word"].verdict(
            f"embedding.padding_idx = {embedding.padding_idx}, the row "
            f"of {word!r}")
    if not row_zero:
        return PADDING["no_padding_idx"].verdict("embedding")
    ids, _ = encode([*SENTENCES, "What is next?"], stoi, pad_id=0)
    with torch.no_grad():
        expected = embedding(ids)
        three = embedding(ids[:3])
    if isinstance(vectors, torch.Tensor) and vectors.shape == three.shape:
        return PADDING["three_sentences"].verdict("vectors")
    if _flattened(vectors, expected):
        return PADDING["flattened"].verdict("vectors")
    problem = check_tensor("vectors", vectors, expected,
                           axes="(B, L, d_model)")
    if problem is not None and isinstance(vectors, torch.Tensor) \
            and vectors.shape == expected.shape:
        return PADDING["other_table"].verdict("vectors")
    if problem is not None:
        return problem
    return Verdict(
        True, "15 rows, <pad> is zeros, and so are the 3 padded positions")


PARAMETERS = catalogue(
    "check_embedding_parameters", 2,
    bias=("an embedding table has no bias: one row of d_model numbers per "
          "token, nothing else", "The embedding table"),
    rounded=("that is the count rounded; give the exact number of "
             "parameters, every digit (rows times numbers per row)",
             "The embedding table"),
    bytes=("that is the size in bytes in float32 (4 bytes a number), not "
           "the number of parameters", "The embedding table"),
    tied_twice=("that is twice the table: its size in bytes in bfloat16 "
                "(2 bytes a number, asked next), or the table counted "
                "twice, as an untied input and output layer; the question "
                "is the parameters of the token embedding table alone",
                "The embedding table"),
    whole_model=("that is all of GPT-2 small, 124,412,160 parameters; "
                 "the question is its token embedding table alone",
                 "The embedding table"),
    rounded_vocab=("that is a vocabulary of 50,000 tokens; GPT-2's has "
                   "exactly 50,257 (256 bytes, 50,000 merges and one "
                   "end-of-text token), one row each",
                   "The embedding table"),
    with_positions=("that adds GPT-2's table of 1,024 learned positions "
                    "(1,024 x 768); the question is the token table alone",
                    "The embedding table"),
    position_table=("that is GPT-2's table of 1,024 learned positions "
                    "(1,024 x 768); the question is the token table, "
                    "one row of 768 numbers for each of the 50,257 "
                    "tokens", "The embedding table"),
    added=("that adds the two sizes; the table has 50,257 rows of 768 "
           "numbers each, so multiply them", "The embedding table"),
    context_rows=("that is 1,024 numbers per token, GPT-2's context "
                  "length; each row holds d_model = 768 numbers",
                  "The embedding table"),
    megabytes=("that is the table's size in megabytes, the answer to the "
               "second question; check_embedding_parameters takes the "
               "number of parameters, rows times numbers per row",
               "The embedding table"),
)


def _rounded(n: object, exact: int) -> bool:
    """Whether ``n`` is ``exact`` rounded to fewer digits, counted in
    units or in millions (38.6 for 38,597,376)."""
    if isinstance(n, torch.Tensor) and n.numel() == 1:
        n = n.item()
    if isinstance(n, bool) or not isinstance(n, (int, float)):
        return False
    return any(
        n * scale != exact
        and math.isclose(n * scale, round(exact, -k), rel_tol=1e-12)
        for scale in (1, 10**6) for k in range(1, len(str(exact))))


def _megabytes(n: object, count: int) -> bool:
    """Whether ``n`` is the size of ``count`` numbers in megabytes (or
    MiB), at 2 or 4 bytes a number, to the 3 digits of 77.2."""
    if isinstance(n, torch.Tensor) and n.numel() == 1:
        n = n.item()
    if isinstance(n, bool) or not isinstance(n, (int, float)):
        return False
    return any(math.isclose(n, nbytes * count / unit, rel_tol=2e-3)
               for nbytes in (2, 4) for unit in (10**6, 2**20))


def check_embedding_parameters(n: int) -> Verdict:
    """Exercise 2.3: the number of parameters in GPT-2 small's token
    embedding table (a vocabulary of 50,257 tokens, ``d_model = 768``)."""
    # shapes only, no memory and no initialisation
    table = nn.Embedding(50257, 768,
                         _weight=torch.empty(50257, 768, device="meta"))
    expected = sum(p.numel() for p in table.parameters())
    if _rounded(n, expected):
        return PARAMETERS["rounded"].verdict(f"n = {n!r}")
    if _megabytes(n, expected):
        return PARAMETERS["megabytes"].verdict(f"n = {n!r}")
    problem = check_number("n", n, expected, mistakes=[
        (PARAMETERS["bias"], expected + 768),
        (PARAMETERS["bias"], expected + 50257),  # a bias per row
        (PARAMETERS["bytes"], 4 * expected),
        (PARAMETERS["tied_twice"], 2 * expected),
        (PARAMETERS["whole_model"], 124_412_160),
        (PARAMETERS["with_positions"], expected + 1024 * 768),
        (PARAMETERS["position_table"], 1024 * 768),
        (PARAMETERS["rounded_vocab"], 50_000 * 768),
        (PARAMETERS["added"], 50257 + 768),
        (PARAMETERS["context_rows"], 50257 * 1024),
    ])
    if problem is not None:
        return problem
    return Verdict(True,
                   f"50,257 rows of 768 numbers: {expected:,} parameters")
