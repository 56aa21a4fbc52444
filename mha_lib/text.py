"""Text to token ids: the running example of chapter 1.

Shape legend: B - batch (sentences), L - length (tokens).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from numbers import Integral

import torch

__all__ = ["tokenize", "build_vocab", "encode"]


def tokenize(text: str) -> list[str]:
    """Split ``text`` into lowercase tokens: drop ``!``, ``.``, ``?``, split
    on spaces; commas stay glued to their words.

    The tokenizer of the running example (Phillips' multi-head attention
    article), kept as it is: a comma stays glued to its word (``"Hello,"``
    -> ``"hello,"``). Derived in chapter 1.

    Args:
        text: One sentence or document.
    """
    if not isinstance(text, str):
        raise TypeError(f"text: expected a str, got {type(text).__name__}")
    for punctuation in ["!", ".", "?"]:
        text = text.replace(punctuation, "")
    return [token.lower() for token in text.split(" ")]


def build_vocab(
    texts: Iterable[str], specials: Sequence[str] = ()
) -> dict[str, int]:
    """Map every distinct token of ``texts`` to an id: ``specials`` first,
    then the tokens in sorted order (so the ids do not depend on the order
    of ``texts``).

    With no specials this is the running example's ``stoi``. Derived in
    chapter 1.

    Args:
        texts: The texts to take the tokens from (a list of str, not one
            str).
        specials: Tokens that get the first ids, in this order, e.g.
            ``["<pad>"]``.
    """
    _check_texts("texts", texts)
    _check_texts("specials", specials)
    tokens = sorted({token for text in texts for token in tokenize(text)}
                    - set(specials))
    return {token: i for i, token in enumerate([*specials, *tokens])}


def encode(
    texts: str | Sequence[str],
    stoi: Mapping[str, int],
    pad_id: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids of a batch of texts, padded on the right with ``pad_id``.

    Returns ``(ids, lengths)``: ids ``(B, L)`` int64 with ``L`` the longest
    text, and lengths ``(B,)``, the number of real tokens per text (d2l's
    ``valid_lens``). Derived in chapter 1.

    Args:
        texts: One text or a list of ``B`` texts.
        stoi: The vocabulary, token -> id (from :func:`build_vocab`); every
            token of ``texts`` must be in it.
        pad_id: The id that fills short texts up to the longest one; may be
            None only when all texts have the same number of tokens.

    Example:
        >>> texts = ["What is next?", "Hello!"]
        >>> tokenize(texts[0])
        ['what', 'is', 'next']
        >>> stoi = build_vocab(texts, specials=("<pad>",))
        >>> ids, lengths = encode(texts, stoi, pad_id=stoi["<pad>"])
        >>> ids.tolist(), lengths.tolist()
        ([[4, 2, 3], [1, 0, 0]], [3, 1])
    """
    if isinstance(texts, str):
        texts = [texts]
    _check_texts("texts", texts)
    if not isinstance(stoi, Mapping):
        raise TypeError(
            f"stoi: expected a mapping token -> id "
            f"(e.g. from build_vocab), got {type(stoi).__name__}")
    if pad_id is not None and (isinstance(pad_id, bool)
                               or not isinstance(pad_id, Integral)):
        raise TypeError(
            f"pad_id: expected an int id or None, got {pad_id!r}")
    rows = []
    for text in texts:
        row = []
        for token in tokenize(text):
            if token not in stoi:
                raise ValueError(
                    f"texts: expected only tokens in stoi, got "
                    f"{token!r} (in {text!r})")
            row.append(stoi[token])
        rows.append(row)
    _check_ids(rows)
    lengths = [len(row) for row in rows]
    longest = max(lengths, default=0)
    if pad_id is None and len(set(lengths)) > 1:
        raise ValueError(
            f"pad_id: expected an id to pad with, since the texts have "
            f"different lengths {lengths}; got None")
    ids = [row + [pad_id] * (longest - len(row)) for row in rows]
    return (torch.tensor(ids, dtype=torch.long).reshape(len(rows), longest),
            torch.tensor(lengths, dtype=torch.long))


def _check_texts(name: str, texts: object) -> None:
    """``texts`` (or ``specials``) must be a collection of str, not one str:
    iterating a str would silently give its characters."""
    if isinstance(texts, str):
        raise TypeError(
            f"{name}: expected a list of str, got a str ({texts!r}); "
            f"for just one, pass [{texts!r}]")
    if not isinstance(texts, Iterable):
        raise TypeError(
            f"{name}: expected a list of str, got {type(texts).__name__}")
    # never consume a one-shot iterator here
    if isinstance(texts, Sequence):
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(
                    f"{name}: expected a list of str, "
                    f"got {type(text).__name__} {text!r} at index {i}")


def _check_ids(rows: list[list[object]]) -> None:
    for row in rows:
        for token_id in row:
            if (isinstance(token_id, bool)
                    or not isinstance(token_id, Integral)):
                raise TypeError(f"stoi: expected int ids, got {token_id!r} "
                                f"({type(token_id).__name__})")
