"""Checkers for chapter 2's exercises (embeddings)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from mha_lib.exercises.verdict import SENTENCES, Verdict, close, compare
from mha_lib.text import build_vocab, encode

__all__ = [
    "check_onehot_embedding",
    "check_padding_embedding",
    "check_embedding_parameters",
]


def check_onehot_embedding(
    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> Verdict:
    """Exercise 2.1: ``fn(ids, weight)`` computes the embedding lookup as
    one-hot @ weight."""
    generator = torch.Generator().manual_seed(2)
    for shape, vocab_size, d_model in (((3, 6), 14, 8), ((2, 5), 30, 4),
                                       ((7,), 5, 3)):
        ids = torch.randint(vocab_size, shape, generator=generator)
        weight = torch.randn(vocab_size, d_model, generator=generator)
        name = (f"fn(ids of shape {tuple(shape)}, "
                f"weight of shape {(vocab_size, d_model)})")
        try:
            given = fn(ids, weight)
        except Exception as error:
            # the reader's code: report it, do not crash the notebook
            return Verdict(
                False, f"{name} raised {type(error).__name__}: {error}")
        verdict = close(name, given, F.embedding(ids, weight), "")
        if not verdict:
            return verdict
    return Verdict(
        True, "one-hot rows @ the table pick the rows nn.Embedding picks")


def check_padding_embedding(
    embedding: nn.Embedding, vectors: torch.Tensor
) -> Verdict:
    """Exercise 2.2: an embedding for the vocabulary with ``"<pad>"`` (id 0)
    whose pad vector is zero, and ``vectors``, the padded batch of chapter 1
    embedded with it."""
    stoi = build_vocab(SENTENCES, specials=("<pad>",))
    if not isinstance(embedding, nn.Embedding):
        return Verdict(False, "embedding should be an nn.Embedding, "
                              f"got {type(embedding).__name__}")
    for name, given, want in (
        ("num_embeddings", embedding.num_embeddings, len(stoi)),
        ("embedding_dim", embedding.embedding_dim, 8),
        ("padding_idx", embedding.padding_idx, stoi["<pad>"]),
    ):
        if given != want:
            return Verdict(
                False, f"embedding.{name} should be {want}, got {given}")
    if embedding.weight[0].abs().sum().item() != 0.0:
        return Verdict(
            False,
            "row 0 of the table (the <pad> vector) should be all zeros")
    ids, _ = encode([*SENTENCES, "What is next?"], stoi, pad_id=0)
    return close(
        "vectors", vectors, embedding(ids).detach(),
        "15 rows, <pad> is zeros, and so are the 3 padded positions")


def check_embedding_parameters(n: int) -> Verdict:
    """Exercise 2.3: the number of parameters in GPT-2 small's token
    embedding table (a vocabulary of 50,257 tokens, ``d_model = 768``)."""
    # shapes only, no memory
    table = nn.Embedding(50257, 768, device="meta")
    expected = sum(p.numel() for p in table.parameters())
    return compare(
        "n", n, expected,
        f"50,257 rows of 768 numbers: {expected:,} parameters")
