"""Checkers for chapter 1's exercises (tokens, vocabulary, padding)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from mha_lib.exercises.verdict import (
    SENTENCES,
    Verdict,
    check_calls,
    compare,
)
from mha_lib.text import build_vocab, encode, tokenize

__all__ = [
    "check_tokenizer",
    "check_vocab",
    "check_padded_batch",
    "strip_all_punctuation",
]


def strip_all_punctuation(text: str) -> list[str]:
    """The answer to Exercise 1.1: :func:`~mha_lib.tokenize` that also drops
    commas."""
    return tokenize(text.replace(",", ""))


def check_tokenizer(fn: Callable[[str], list[str]]) -> Verdict:
    """Exercise 1.1: a tokenizer like :func:`~mha_lib.tokenize` that also
    drops commas."""
    cases = [(text,) for text in [*SENTENCES, "Well, well, well.",
                                  "no punctuation here"]]
    return check_calls(
        fn, cases, strip_all_punctuation,
        "commas are gone and everything else is as tokenize() does it")


def check_vocab(stoi: dict[str, int]) -> Verdict:
    """Exercise 1.2: the vocabulary of the running example with ``"<pad>"``
    as id 0."""
    expected = build_vocab(SENTENCES, specials=("<pad>",))
    if not isinstance(stoi, dict):
        return Verdict(
            False, f"stoi should be a dict from token to id, "
                   f"got {type(stoi).__name__}")
    if stoi.get("<pad>") != 0:
        return Verdict(
            False, f'"<pad>" should have id 0, got {stoi.get("<pad>")!r}')
    missing = sorted(set(expected) - set(stoi))
    if missing:
        return Verdict(False, f"tokens missing from stoi: {missing}")
    return compare("stoi", stoi, expected,
                   f"{len(expected)} entries, <pad> first, then sorted")


def check_padded_batch(ids: torch.Tensor, lengths: torch.Tensor) -> Verdict:
    """Exercise 1.3: ``"What will come next?"`` and ``"A basic split!"`` as
    one batch, padded with the ``"<pad>"`` id of :func:`check_vocab`'s
    vocabulary."""
    stoi = build_vocab(SENTENCES, specials=("<pad>",))
    want_ids, want_lengths = encode(
        ["What will come next?", "A basic split!"], stoi, pad_id=0)
    for name, given, want in (("ids", ids, want_ids),
                              ("lengths", lengths, want_lengths)):
        if not isinstance(given, torch.Tensor):
            return Verdict(
                False, f"{name} should be a tensor, "
                       f"got {type(given).__name__}")
        if given.shape != want.shape:
            return Verdict(
                False, f"{name} should have shape {tuple(want.shape)}, "
                       f"got {tuple(given.shape)}")
        if not torch.equal(given.long(), want):
            return Verdict(
                False, f"{name} should be {want.tolist()}, "
                       f"got {given.tolist()}")
    return Verdict(
        True,
        "two rows of four ids, the shorter padded with 0; lengths [4, 3]")
