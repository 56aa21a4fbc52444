"""Text to token ids: the running example of chapter 1.

Shape legend: B - batch (sentences), L - length (tokens).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch

__all__ = ["tokenize", "build_vocab", "encode"]


def tokenize(text: str) -> list[str]:
    """Split ``text`` into lowercase tokens: drop ``!``, ``.``, ``?``, split on spaces.

    Seed 001's tokenizer, kept as it is: a comma stays glued to its word
    (``"Hello,"`` -> ``"hello,"``). Derived in chapter 1.
    """
    for punctuation in ["!", ".", "?"]:
        text = text.replace(punctuation, "")
    return [token.lower() for token in text.split(" ")]


def build_vocab(texts: Iterable[str], specials: Sequence[str] = ()) -> dict[str, int]:
    """Map every distinct token of ``texts`` to an id: ``specials`` first, then the
    tokens in sorted order (so the ids do not depend on the order of ``texts``).

    With no specials this is seed 001's ``stoi``. Derived in chapter 1.
    """
    tokens = sorted({token for text in texts for token in tokenize(text)} - set(specials))
    return {token: i for i, token in enumerate([*specials, *tokens])}


def encode(
    texts: str | Sequence[str],
    stoi: Mapping[str, int],
    pad_id: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids of a batch of texts, padded on the right with ``pad_id``.

    Returns ``(ids, lengths)``: ids ``(B, L)`` int64 with ``L`` the longest text, and
    lengths ``(B,)``, the number of real tokens per text (d2l's ``valid_lens``).
    Derived in chapter 1.
    """
    if isinstance(texts, str):
        texts = [texts]
    rows = []
    for text in texts:
        row = []
        for token in tokenize(text):
            if token not in stoi:
                raise ValueError(f"texts: expected tokens that are in stoi, got {token!r} "
                                 f"(from {text!r}), which is not")
            row.append(stoi[token])
        rows.append(row)
    lengths = [len(row) for row in rows]
    longest = max(lengths, default=0)
    if pad_id is None and len(set(lengths)) > 1:
        raise ValueError(f"pad_id: expected an id to pad with, since the texts have different "
                         f"lengths {lengths}; got None")
    ids = [row + [pad_id] * (longest - len(row)) for row in rows]
    return torch.tensor(ids, dtype=torch.long).reshape(len(rows), longest), torch.tensor(lengths)
