"""Checkers for chapter 1's exercises (tokens, vocabulary, padding)."""

from __future__ import annotations

import itertools
import unicodedata
from collections import Counter
from collections.abc import Callable

import torch

from mha_lib.exercises.verdict import (
    SENTENCES,
    Verdict,
    attempt,
    catalogue,
    check_number,
    check_tensor,
    see,
)
from mha_lib.text import build_vocab, encode, tokenize

__all__ = [
    "check_tokenizer",
    "check_vocab",
    "check_padded_batch",
    "check_bpe_merges",
    "check_bpe_split",
    "check_pad_scores",
    "check_byte_ids",
    "strip_all_punctuation",
    "BPE_CORPUS",
]


def strip_all_punctuation(text: str) -> list[str]:
    """The reference that :func:`check_tokenizer` compares with."""
    return tokenize(text.replace(",", ""))


TOKENIZER = catalogue(
    "check_tokenizer", 1,
    comma_token=("the comma is kept as a token of its own (','): this "
                 "exercise removes commas, as tokenize removes ! . ?; "
                 "delete them before splitting", "Tokenization"),
    comma_kept=("a comma is still glued to its word (\"hello,\"): remove "
                "the commas before splitting", "Tokenization"),
    comma_space=("a comma with no space after it stays (\"1,000\"): "
                 "deleting \", \", a comma followed by a space, misses it; "
                 "delete every \",\", wherever it stands", "Tokenization"),
    inner_comma=("a comma inside a word stays (\"1,000\"): stripping the "
                 "ends of each token misses it; delete every comma, "
                 "wherever it stands", "Tokenization"),
    inner_period=("a . inside a word stays (\"3.5\"), but tokenize "
                  "deletes every ! . ? wherever it stands, giving \"35\": "
                  "delete, do not strip", "Tokenization"),
    empty_token=("there is an empty token: a comma replaced by a space "
                 "leaves two spaces in a row; delete the commas instead",
                 "Tokenization"),
    not_lowercase=("the tokens should be lowercase, as tokenize makes "
                   "them", "Tokenization"),
    whitespace_split=("split() without an argument also swallows runs of "
                      "spaces (\"two  spaces\" gives no empty token ''): "
                      "tokenize splits on every single space, so split on "
                      "\" \", or call tokenize after deleting the commas",
                      "Tokenization"),
    dropped_empty=("the empty token '' between two spaces in a row "
                   "(\"two  spaces\") is gone, but tokenize keeps it: "
                   "keep every piece split(\" \") gives, with no filter "
                   "on empty tokens", "Tokenization"),
    strip_and_split=("two things differ from tokenize: stripping the ends "
                     "of each token misses a comma inside a word "
                     "(\"1,000\"), and split() without an argument "
                     "swallows runs of spaces (\"two  spaces\" gives no "
                     "empty token ''): delete every comma, then split on "
                     "\" \"", "Tokenization"),
    marks_kept=("a ! . or ? is still glued to its word (\"next!\" keeps "
                "its !): tokenize deletes every ! . ?; delete the commas, "
                "then call tokenize", "Tokenization"),
    glued_words=("two words are glued into one: deleting \", \", the "
                 "comma with the space after it, removes the space "
                 "between them; delete only the commas",
                 "Tokenization"),
    joined_string=("the tokens come back as one string: return the list "
                   "of tokens, as tokenize does, not joined by spaces",
                   "Tokenization"),
    too_much_removed=("other characters went too (an apostrophe, a "
                      "hyphen, a colon, a semicolon or a quote mark): only "
                      "commas go, besides the ! . ? that tokenize drops",
                      "Tokenization"),
)


def check_tokenizer(fn: Callable[[str], list[str]]) -> Verdict:
    """Exercise 1.1: a tokenizer like :func:`~mha_lib.tokenize` that also
    drops commas."""
    for text in [*SENTENCES, "Well, well, well.", "no punctuation here",
                 "Don't stop, said the well-known cat.",
                 "Dr. Who? It costs 3.5 euros!",
                 "It costs 1,000 euros, or 1,500.",
                 "Two  spaces, then one.",
                 'He said: "no; not yet".']:
        call = attempt(fn, text, shown=repr(text))
        if call.verdict is not None:
            return call.verdict
        given, want = call.value, strip_all_punctuation(text)
        if given == want:
            continue
        if isinstance(given, str):
            return TOKENIZER["joined_string"].verdict(call.label)
        if not isinstance(given, list) or not all(
                isinstance(t, str) for t in given):
            return Verdict(False, f"{call.label} should be a list of "
                                  f"str, got {type(given).__name__} "
                                  f"{see('Tokenization', 1)}")
        dropped = "" in want and given == [t for t in want if t]
        if dropped:
            # split() also splits at a tab; a filter on '' does not
            tab = attempt(fn, "a\tb", shown=repr("a\tb"))
            if tab.value != ["a", "b"]:
                return TOKENIZER["dropped_empty"].verdict(call.label)
        inner = any("," in t.strip(",") for t in given)
        wrong = (
            (TOKENIZER["whitespace_split"], dropped),
            (TOKENIZER["strip_and_split"],
             inner and _splits_any_whitespace(fn)),
            (TOKENIZER["inner_period"],
             any("." in t.strip(".") for t in given)),
            (TOKENIZER["comma_token"], "," in given),
            (TOKENIZER["comma_kept"],
             any(t.startswith(",") or t.endswith(",") for t in given)),
            (TOKENIZER["comma_space"], inner and _keeps_a_last_comma(fn)),
            (TOKENIZER["inner_comma"], any("," in t for t in given)),
            (TOKENIZER["marks_kept"],
             any(m in t for t in given for m in "!.?")),
            (TOKENIZER["empty_token"], "" in given and "" not in want),
            (TOKENIZER["not_lowercase"],
             [t.lower() for t in given] == want),
            (TOKENIZER["too_much_removed"],
             len("".join(given)) < len("".join(want))),
        )
        for mistake, found in wrong:
            if found:
                return mistake.verdict(call.label)
        glued = [a + b for a, b in zip(want, want[1:], strict=False)
                 if a + b in given]
        if glued:  # "hello" and "what" as "hellowhat"
            return TOKENIZER["glued_words"].verdict(
                f"{call.label} gives {glued[0]!r}")
        i = _first_difference(given, want)
        got = repr(given[i]) if i < len(given) else "nothing"
        wanted = repr(want[i]) if i < len(want) else "nothing"
        return Verdict(False, f"{call.label} gives {len(given)} tokens; "
                              f"the first that differs is token {i + 1} "
                              f"(counting from 1): {got} instead of "
                              f"{wanted}")
    return Verdict(
        True, "commas are gone and everything else is as tokenize() "
              "does it")


def _splits_any_whitespace(fn: Callable[[str], list[str]]) -> bool:
    """Whether ``fn`` splits like ``str.split()``: runs of spaces and a
    tab give no empty token."""
    return attempt(fn, "a  b\tc", shown=repr("a  b\tc")).value == [
        "a", "b", "c"]


def _keeps_a_last_comma(fn: Callable[[str], list[str]]) -> bool:
    """Whether ``fn`` keeps a comma with no space after it, as deleting
    only ", " does (stripping each token's ends does not)."""
    return attempt(fn, "yes,", shown=repr("yes,")).value == ["yes,"]


def _first_difference(given: list, want: list) -> int:
    for i, (a, b) in enumerate(zip(given, want, strict=False)):
        if a != b:
            return i
    return min(len(given), len(want))


VOCAB = catalogue(
    "check_vocab", 1,
    no_pad=("there is no \"<pad>\": pass it to build_vocab as a special "
            "token", "Padding sentences of different lengths"),
    pad_last=("\"<pad>\" should come first, id 0, and the words after "
              "it: specials get the first ids",
              "Padding sentences of different lengths"),
    shared_id=("two tokens share one id (adding \"<pad>\": 0 to the old "
               "vocabulary leaves \"a\" at 0 too): ids must be distinct, "
               "so with \"<pad>\" first every word moves up by one; pass "
               "\"<pad>\" to build_vocab as a special token",
               "Padding sentences of different lengths"),
    unsorted=("the ids do not follow the sorted order of the words "
              "(numbered as they first appear?); build_vocab sorts them, "
              "so the ids do not depend on the order of the sentences",
              "The vocabulary"),
    commas=("\"hello,\" and \"hello\" are different tokens: build the "
            "vocabulary with tokenize, as it is", "Tokenization"),
    offset=("the words are in sorted order, but their ids should "
            "follow \"<pad>\" without a gap: \"a\" is 1, \"basic\" 2, "
            "and so on", "The vocabulary"),
    not_lowercased=("the tokens keep their capitals (\"Hello,\", \"I\"): "
                    "tokenize lowercases every word, so build the "
                    "vocabulary from tokenize(sentence)", "Tokenization"),
    itos=("the keys are ids and the values tokens: this is itos (index "
          "to string); pass stoi, which maps each token to its id",
          "The vocabulary"),
    extra_special=("a special token the exercise does not ask for: "
                   "\"<pad>\" is the only special here (a catch-all "
                   "\"<unk>\" is a choice for unseen words, not needed "
                   "for these sentences)", "Unknown words: subword "
                                           "tokenizers"),
)


def check_vocab(stoi: dict[str, int]) -> Verdict:
    """Exercise 1.2: the vocabulary of the running example with ``"<pad>"``
    as id 0."""
    expected = build_vocab(SENTENCES, specials=("<pad>",))
    if not isinstance(stoi, dict):
        return Verdict(
            False, f"stoi should be a dict from token to id, "
                   f"got {type(stoi).__name__}")
    if stoi == expected:
        return Verdict(True,
                       f"{len(expected)} entries, <pad> first, then sorted")
    words = [w for w in expected if w != "<pad>"]
    if stoi and all(isinstance(k, int) and isinstance(v, str)
                    for k, v in stoi.items()):
        return VOCAB["itos"].verdict("stoi")
    if "<pad>" not in stoi:
        return VOCAB["no_pad"].verdict("stoi")
    if stoi["<pad>"] != 0:
        return VOCAB["pad_last"].verdict("stoi")
    if any(isinstance(k, str) and not k.startswith("<") and k != k.lower()
           for k in stoi):
        return VOCAB["not_lowercased"].verdict("stoi")
    if "hello" not in stoi and "hello," not in stoi:
        return Verdict(False, "stoi is missing words of the three "
                              "sentences")
    if ("hello" in stoi) != ("hello" in expected):
        return VOCAB["commas"].verdict("stoi")
    if len(set(stoi.values())) < len(stoi):
        return VOCAB["shared_id"].verdict("stoi")
    if set(stoi) == set(expected):
        if sorted(words, key=stoi.__getitem__) == words:
            return VOCAB["offset"].verdict("stoi")
        return VOCAB["unsorted"].verdict("stoi")
    missing = sorted(set(expected) - set(stoi))
    extra = sorted(set(stoi) - set(expected))
    if not missing and all(k.startswith("<") for k in extra):
        return Verdict(False, f"stoi: extra {extra}: "
                              f"{VOCAB['extra_special'].message}")
    wrong = ", ".join(f"{name} {keys}" for name, keys in (
        ("missing", missing), ("extra", extra)) if keys)
    return Verdict(False, f"stoi should have the {len(words)} tokens of "
                          f"the sentences and \"<pad>\"; {wrong}")


PADDED = catalogue(
    "check_padded_batch", 1,
    pad_id=("the pads should be the id of \"<pad>\", 0",
            "Padding sentences of different lengths"),
    no_pad_vocab=("the ids are those of the vocabulary without \"<pad>\" "
                  "(each one too small by 1): encode with the vocabulary "
                  "of Exercise 1.2", "Padding sentences of different "
                                     "lengths"),
    padded_lengths=("lengths should be the true lengths, before padding, "
                    "not the padded length", "Padding sentences of "
                                             "different lengths"),
    last_index=("these look like the index of each row's last token "
                "(counting from 0): a length counts the tokens, one more",
                "Padding sentences of different lengths"),
    pad_counts=("lengths should count the real tokens of each text, "
                "not its pads", "Padding sentences of different lengths"),
    transposed=("the batch is transposed: one row per text, "
                "(B, L) = (2, 4), not one column per text",
                "Padding sentences of different lengths"),
    left_padding=("the pads are on the left; encode pads on the right, "
                  "after the last token", "Padding sentences of different "
                                          "lengths"),
    swapped=("the rows are in the wrong order: row 0 is \"What will "
             "come next?\", row 1 \"A basic split!\"",
             "Padding sentences of different lengths"),
    swapped_lengths=("the lengths are in the wrong order: lengths[b] "
                     "is the length of row b, 4 for \"What will come "
                     "next?\", then 3", "Padding sentences of "
                                        "different lengths"),
    ragged=("the rows have different lengths: pad the shorter one with "
            "the id of \"<pad>\" to the length of the longer",
            "Padding sentences of different lengths"),
    tokens=("these are tokens, not ids: look each token up in the "
            "vocabulary of Exercise 1.2 (stoi[token]) and pad with the "
            "id of \"<pad>\", 0", "Encoding a batch"),
    padded_too_far=("the rows are padded beyond the longest text: encode "
                    "pads to the longest text of this batch, 4 tokens "
                    "(not, say, to the 6 of the running example)",
                    "Padding sentences of different lengths"),
    floats=("ids and lengths are whole numbers: write them as integers "
            "(4, not 4.0); encode returns int64", "Encoding a batch"),
)


def _as_tensor(value: object) -> object:
    """A list or tuple of numbers as a tensor (a hand-written answer);
    anything else, or a ragged list, unchanged."""
    if isinstance(value, list | tuple):
        try:
            return torch.tensor(value)
        except (TypeError, ValueError, RuntimeError):
            return value
    return value


PADDING = "Padding sentences of different lengths"


def _pointed(problem: Verdict | None, section: str) -> Verdict | None:
    """``problem`` with the section that explains it, when the generic
    verdict (no catalogued mistake matched) names none."""
    if problem is None or problem.ok or "(see '" in problem.message:
        return problem
    return Verdict(False, f"{problem.message} {see(section, 1)}")


def check_padded_batch(ids: torch.Tensor, lengths: torch.Tensor) -> Verdict:
    """Exercise 1.2: ``"What will come next?"`` and ``"A basic split!"`` as
    one batch, padded with the ``"<pad>"`` id of :func:`check_vocab`'s
    vocabulary; tensors or (hand-written) lists."""
    if isinstance(ids, list | tuple) and any(
            isinstance(row, list | tuple)
            and any(isinstance(t, str) for t in row) for row in ids):
        return PADDED["tokens"].verdict("ids")
    if isinstance(ids, list | tuple) and len(ids) > 1 and all(
            isinstance(row, list | tuple) for row in ids) \
            and len({len(row) for row in ids}) > 1:
        return PADDED["ragged"].verdict("ids")
    ids, lengths = _as_tensor(ids), _as_tensor(lengths)
    stoi = build_vocab(SENTENCES, specials=("<pad>",))
    texts = ["What will come next?", "A basic split!"]
    want_ids, want_lengths = encode(texts, stoi, pad_id=0)
    plain_ids, _ = encode(texts, build_vocab(SENTENCES), pad_id=0)
    left = torch.stack([row.roll(int(row.size(0) - n))
                        for row, n in zip(want_ids, want_lengths,
                                          strict=True)])
    swapped, _ = encode(texts[::-1], stoi, pad_id=0)

    if isinstance(ids, torch.Tensor) and ids.shape == want_ids.shape \
            and not torch.equal(ids.long(), want_ids):
        real = (torch.arange(want_ids.size(1))
                < want_lengths[:, None])  # (B, L): not a pad
        if torch.equal(ids[real].long(), plain_ids[real]):
            return PADDED["no_pad_vocab"].verdict("ids")
        if torch.equal(ids[real].long(), want_ids[real]):
            return PADDED["pad_id"].verdict("ids")
    if isinstance(ids, torch.Tensor) and ids.dim() == 2 \
            and ids.size(0) == 2 and ids.size(1) > want_ids.size(1) \
            and torch.equal(ids[:, :want_ids.size(1)].long(), want_ids) \
            and not ids[:, want_ids.size(1):].any():
        return PADDED["padded_too_far"].verdict("ids")
    problem = check_tensor("ids", ids, want_ids, axes="(B, L)",
                           mistakes=[(PADDED["transposed"], want_ids.T),
                                     (PADDED["left_padding"], left),
                                     (PADDED["swapped"], swapped)])
    if problem is None and ids.is_floating_point():
        return PADDED["floats"].verdict("ids")
    if problem is not None:
        return _pointed(problem, PADDING)
    problem = check_tensor(
        "lengths", lengths, want_lengths, axes="(B,)", mistakes=[
            (PADDED["padded_lengths"],
             torch.full_like(want_lengths, want_ids.size(1))),
            (PADDED["pad_counts"], want_ids.size(1) - want_lengths),
            (PADDED["last_index"], want_lengths - 1),
            (PADDED["swapped_lengths"], want_lengths.flip(0))])
    if problem is None and lengths.is_floating_point():
        return PADDED["floats"].verdict("lengths")
    if problem is not None:
        return _pointed(problem, PADDING)
    return Verdict(
        True,
        "two rows of four ids, the shorter padded with 0; lengths [4, 3]")


# Exercise 1.3: the toy corpus whose first three merges the reader finds
BPE_CORPUS = {"pug": 7, "bug": 8, "bun": 5, "hugs": 6}


def _bpe(word_counts: dict[str, int], num_merges: int, end: bool = True,
         weighted: bool = True, recount: bool = True
         ) -> list[tuple[str, str]]:
    """BPE as chapter 1 runs it (ties to the pair counted first); the
    flags plant the classic mistakes."""
    words = {((*w, "</w>") if end else tuple(w)): (n if weighted else 1)
             for w, n in word_counts.items()}

    def count() -> Counter:
        pairs: Counter = Counter()
        for symbols, n in words.items():
            for pair in zip(symbols, symbols[1:], strict=False):
                pairs[pair] += n
        return pairs

    if not recount:
        return [pair for pair, _ in count().most_common(num_merges)]
    merges = []
    for _ in range(num_merges):
        pairs = count()
        if not pairs:  # every word is one symbol: nothing left to merge
            break
        best = pairs.most_common(1)[0][0]
        merges.append(best)
        merged = {}
        for symbols, n in words.items():
            out, i = [], 0
            while i < len(symbols):
                if symbols[i:i + 2] == best:
                    out.append(symbols[i] + symbols[i + 1])
                    i += 2
                else:
                    out.append(symbols[i])
                    i += 1
            merged[tuple(out)] = n
        words = merged
    return merges


def _words_after(word_counts: dict[str, int],
                 merges: list[tuple[str, str]]) -> list[tuple[str, ...]]:
    """The words as symbols once ``merges`` are applied."""
    words = [(*w, "</w>") for w in word_counts]
    for best in merges:
        merged = []
        for symbols in words:
            out, i = [], 0
            while i < len(symbols):
                if tuple(symbols[i:i + 2]) == best:
                    out.append(symbols[i] + symbols[i + 1])
                    i += 2
                else:
                    out.append(symbols[i])
                    i += 1
            merged.append(tuple(out))
        words = merged
    return words


def _pair_counts(word_counts: dict[str, int],
                 merges: list[tuple[str, str]]) -> Counter:
    """The adjacent pairs once ``merges`` are applied, weighted by the
    word counts."""
    pairs: Counter = Counter()
    for s, n in zip(_words_after(word_counts, merges),
                    word_counts.values(), strict=True):
        for pair in zip(s, s[1:], strict=False):
            pairs[pair] += n
    return pairs


def _before(merges: list[tuple[str, str]]) -> str:
    """``merges`` in words, for a hint."""
    if len(merges) == 1:
        return f"after the merge {merges[0]}"
    return "after the merges " + ", ".join(str(m) for m in merges)


def _stale_example(pair: tuple[str, str],
                   merges: list[tuple[str, str]]) -> str:
    """A word that held ``pair`` and how ``merges`` rewrote it, e.g.
    " (after the merge ('u', 'g'), pug is p ug </w>)"; "" if none."""
    now = _words_after(BPE_CORPUS, merges)
    for k in range(len(merges)):
        then = _words_after(BPE_CORPUS, merges[:k])
        for word, old, new in zip(BPE_CORPUS, then, now, strict=True):
            if pair in zip(old, old[1:], strict=False):
                return f" ({_before(merges)}, {word} is {' '.join(new)})"
    return ""


SECTION = "Byte-pair encoding"
BPE = catalogue(
    "check_bpe_merges", 1,
    joined=("write each merge as the pair it joins, (\"u\", \"g\"), not "
            "the joined string \"ug\"", SECTION),
    no_end_marker=("these are the merges without the end-of-word marker: "
                   "every word ends in \"</w>\", which pairs with the last "
                   "letter like any other symbol", SECTION),
    unweighted=("after the first two merges, (\"b\", \"ug</w>\") is "
                "counted 8 times (bug) and (\"p\", \"ug</w>\") 7 times "
                "(pug): a pair counts once for each time a word that holds "
                "it occurs, and the third merge is the most frequent pair",
                SECTION),
    not_recounted=("these are the most frequent pairs of the first count; "
                   "after each merge the words change, so count the pairs "
                   "again, the new symbol included", SECTION),
    stale_pair=("that pair is no longer in the words: each merge rewrites "
                "the words before the next count; count the pairs of "
                "the words as the merges before left them", SECTION),
    reversed_pair=("a pair is ordered, its left symbol first, as the two "
                   "stand in a word: this pair is the wrong way round, "
                   "and no word holds its two symbols in that order",
                   SECTION),
    wrong_order=("the right merges in the wrong order: the most frequent "
                 "pair is merged first", SECTION),
    misspelt_marker=("the end-of-word marker is spelt \"</w>\", four "
                     "characters, and a merge with it keeps them: "
                     "\"ug</w>\"", SECTION),
    count=("the exercise asks for exactly three merges: stop after the "
           "third, and count the pairs again before each one", SECTION),
)


def _marker_as(merges: list[tuple[str, str]],
               want: list[tuple[str, str]]) -> str | None:
    """The string ``merges`` writes for ``"</w>"`` where they are
    ``want`` with the marker spelt otherwise, else None."""
    spellings = set()
    for got, right in zip(merges, want, strict=True):
        for x, y in zip(got, right, strict=True):
            if x == y:
                continue
            head = y.split("</w>")[0]
            if "</w>" not in y or not x.startswith(head):
                return None
            spellings.add(x[len(head):])
    marker = spellings.pop() if len(spellings) == 1 else ""
    return marker or None  # "" drops the marker: a stale pair, not this


def check_bpe_merges(merges: list[tuple[str, str]]) -> Verdict:
    """Exercise 1.3: the first three merges of BPE on ``BPE_CORPUS``,
    with the end-of-word marker ``"</w>"``, as a list of pairs."""
    want = _bpe(BPE_CORPUS, 3)
    if not isinstance(merges, (list, tuple)):
        return Verdict(False, f"merges should be a list of pairs, got "
                              f"{type(merges).__name__} "
                              f"{see(SECTION, 1)}")
    merges = list(merges)
    if merges and all(isinstance(m, str) for m in merges):
        return BPE["joined"].verdict("merges")
    if not all(isinstance(m, (list, tuple)) and len(m) == 2
               and all(isinstance(s, str) for s in m) for m in merges):
        return Verdict(False, "merges should be a list of pairs of "
                              "strings, such as [(\"u\", \"g\"), ...]")
    merges = [tuple(m) for m in merges]
    if len(merges) != len(want):
        pairs = zip(merges, want, strict=False)
        right = sum(1 for _ in itertools.takewhile(
            lambda pair: pair[0] == pair[1], pairs))
        return BPE["count"].verdict(f"merges ({len(merges)} merges, the "
                                    f"first {right} right)")
    if merges == want:
        return Verdict(True, "three merges, each the most frequent pair "
                             "after the ones before")
    mistakes = (
        ("no_end_marker", _bpe(BPE_CORPUS, 3, end=False)),
        ("unweighted", _bpe(BPE_CORPUS, 3, weighted=False)),
        ("not_recounted", _bpe(BPE_CORPUS, 3, recount=False)),
    )
    for name, planted in mistakes:
        if merges == planted:
            return BPE[name].verdict("merges")
    if sorted(merges) == sorted(want):
        return BPE["wrong_order"].verdict("merges")
    marker = _marker_as(merges, want)
    if marker is not None:
        return BPE["misspelt_marker"].verdict(f"merges (\"{marker}\")")
    pairs = zip(merges, want, strict=False)
    first = next((i for i, (a, b) in enumerate(pairs) if a != b),
                 min(len(merges), len(want)))
    counts = _pair_counts(BPE_CORPUS, want[:first])
    if (first < len(merges) and merges[first] not in counts
            and merges[first][::-1] in counts):
        return BPE["reversed_pair"].verdict(f"merges[{first}] = "
                                            f"{merges[first]}")
    if first < len(merges) and merges[first] not in counts:
        return BPE["stale_pair"].verdict(
            f"merges[{first}] = {merges[first]}"
            + _stale_example(merges[first], want[:first]))
    where = (f"{_before(want[:first])}, " if first else "") + "in the words"
    if first < len(merges):
        got, top = counts[merges[first]], counts[want[first]]
        than = ("ties with a pair counted before it, and the tie goes "
                "to the pair counted first" if got == top else
                f"another pair is counted {top} times")
        return Verdict(False, f"merges[{first}] = {merges[first]}: "
                              f"{where}, weighted by the word counts, "
                              f"that pair is counted {got} times, but "
                              f"{than} {see(SECTION, 1)}")
    return Verdict(False, f"merges[{first}] is not the most frequent "
                          f"pair {where}: count the pairs again, weighted "
                          f"by the word counts (see '{SECTION}' in "
                          f"chapter 1)")


SPLIT = catalogue(
    "check_bpe_split", 1,
    whole_word=("\"bug\" is no piece of bugs: the merge that made bug "
                "one piece is (\"b\", \"ug</w>\"), a bug at the end of "
                "a word, and in bugs \"ug\" is followed by \"s\", not "
                "by \"</w>\"", SECTION),
    no_end_marker=("a split ends with the end-of-word marker \"</w>\", a "
                   "piece of its own when no merge joins it", SECTION),
    marker_joined=("no merge joins \"s\" and \"</w>\": (\"s\", "
                   "\"</w>\") is not among the three merges, so the two "
                   "stay apart", SECTION),
    one_string=("the pieces are one string: write them as a list, one "
                "string per piece, such as [\"x\", \"y\", \"</w>\"]",
                SECTION),
    marker_inside=("\"</w>\" marks the end of the word, so only the "
                   "last piece can hold it: \"ug</w>\" cannot come "
                   "before \"s\"", SECTION),
    whole_word_unmade=("no merge makes \"bugs\" one piece: the three "
                       "merges make only \"ug\", \"ug</w>\" and "
                       "\"bug</w>\", so bugs stays several pieces",
                       SECTION),
    unmerged=("apply the merges in order: the first, (\"u\", \"g\"), "
              "joins the u and g of bugs", SECTION),
    unmade_piece=("no merge makes that piece: a merged piece such as "
                  "\"ug\" takes in the symbol after it only when a merge "
                  "joins exactly that pair, and (\"ug\", \"s\") is not "
                  "among the three merges", SECTION),
    first_only=("only the first occurrence of a pair is merged: a merge "
                "joins every occurrence in the word (\"hugbug\" holds "
                "u g twice), so keep scanning after a join", SECTION),
    not_in_order=("the merges are not applied in the order they were "
                  "learned: apply merges[0] to the whole word, then "
                  "merges[1], and so on (joining the leftmost pair that "
                  "is a merge, or the last merge first, gives other "
                  "pieces)", SECTION),
    overlapping=("the pieces spell more than the word: after joining two "
                 "symbols, skip both, since the second is already used "
                 "(\"aaa\" with the merge (\"a\", \"a\") is aa a </w>)",
                 SECTION),
    longest_match=("this is d2l's rule, the longest known piece from the "
                   "left: BPE replays the merges in the order learned, "
                   "and the two differ (\"nest\" with the chapter's ten "
                   "merges)", SECTION),
    end_marker_missing=("the split should end with the end-of-word marker "
                        "\"</w>\": start from the word's characters "
                        "followed by \"</w>\"", SECTION),
    string_replace=("str.replace on the symbols joined by spaces (as "
                    "d2l's merge_symbols does) also joins a pair across "
                    "two pieces: in \"n est</w>\" the merge (\"n\", "
                    "\"e\") finds \"n e\" and gives nest</w>; compare "
                    "whole symbols, in a list, instead", SECTION),
    marker_dropped=("the end-of-word marker \"</w>\" was dropped from the "
                    "end: where no merge joins it, it stays the last "
                    "piece, on its own", SECTION),
    right_to_left=("each merge should scan the word left to right, from "
                   "its first symbol: scanning from the end joins other "
                   "pairs "
                   "(\"aaa\" with the merge (\"a\", \"a\") is aa a </w>, "
                   "not a aa </w>)", SECTION),
    d2l_marker=("\"_\" is d2l's end-of-word marker; this chapter, like "
                "Sennrich et al., writes \"</w>\", and the merges join "
                "it (\"ug</w>\" is a piece): end the word with \"</w>\"",
                SECTION),
)

# Exercise 1.5: the words and merges check_bpe_split tries a function on
SENNRICH = {"low": 5, "lower": 2, "newest": 6, "widest": 3}


def _split(word: str, merges: list[tuple[str, str]], how: str = "") -> list:
    """``word`` split by ``merges`` as chapter 1's bpe_split does, or with
    a planted mistake (``how``)."""
    symbols = [*word] if how == "end_marker_missing" else [*word, "</w>"]
    if how == "string_replace":  # d2l's merge_symbols: on one string
        text = " ".join(symbols)
        for a, b in merges:
            text = text.replace(f"{a} {b}", a + b)
        return text.split(" ")
    if how == "marker_dropped":  # a right split, less a lone "</w>"
        right = _split(word, merges)
        return right[:-1] if right[-1] == "</w>" else right
    if how == "longest_match":
        known = {*symbols, *("".join(m) for m in merges)}
        text, out = "".join(symbols), []
        while text:
            size = max(n for n in range(1, len(text) + 1)
                       if text[:n] in known or n == 1)
            out.append(text[:size])
            text = text[size:]
        return out
    if how == "right_to_left":  # each merge scanned from the word's end
        for pair in merges:
            out, i = [], len(symbols)
            while i > 0:
                if i > 1 and tuple(symbols[i - 2:i]) == tuple(pair):
                    out.insert(0, symbols[i - 2] + symbols[i - 1])
                    i -= 2
                else:
                    out.insert(0, symbols[i - 1])
                    i -= 1
            symbols = out
        return symbols
    if how == "leftmost":  # join the leftmost pair that is a merge
        ranked = {tuple(m) for m in merges}
        while True:
            at = next((i for i in range(len(symbols) - 1)
                       if (symbols[i], symbols[i + 1]) in ranked), None)
            if at is None:
                return symbols
            symbols[at:at + 2] = [symbols[at] + symbols[at + 1]]
    for pair in (merges[::-1] if how == "reversed" else merges):
        out, i, joined = [], 0, False
        while i < len(symbols):
            if (tuple(symbols[i:i + 2]) == tuple(pair)
                    and not (how == "first_only" and joined)):
                out.append(symbols[i] + symbols[i + 1])
                joined = True
                i += 1 if how == "overlapping" else 2
            else:
                out.append(symbols[i])
                i += 1
        symbols = out
    return symbols


def _split_cases() -> list[tuple[str, list[tuple[str, str]]]]:
    """(word, merges): BPE_CORPUS's three merges, the chapter's ten on
    Sennrich's corpus, and one merge that can overlap itself."""
    three, ten = _bpe(BPE_CORPUS, 3), _bpe(SENNRICH, 10)
    return [("bugs", three), ("hugbug", three), ("pug", three),
            ("lowest", ten), ("nest", ten), ("slower", ten),
            ("newest", ten), ("aaa", [("a", "a")]),
            ("banana", [("a", "n"), ("b", "an"), ("an", "a")]),
            ("abcd", [("a", "b"), ("c", "d"), ("b", "c"), ("a", "bc")])]


def _check_split_function(fn: Callable) -> Verdict:
    """Exercise 1.5: ``fn(word, merges)``, a bpe_split written by the
    reader, on the words of :func:`_split_cases`."""
    cases, given = _split_cases(), []
    for word, merges in cases:
        call = attempt(fn, word, list(merges),
                       shown=f"{word!r}, {len(merges)} "
                             f"merge{'s' * (len(merges) != 1)}")
        if call.verdict is not None:
            return call.verdict
        if isinstance(call.value, str):
            return SPLIT["one_string"].verdict(call.label)
        if not isinstance(call.value, (list, tuple)) or not all(
                isinstance(p, str) for p in call.value):
            return Verdict(False, f"{call.label} should return a list of "
                                  f"strings, got "
                                  f"{type(call.value).__name__} "
                                  f"{see(SECTION, 1)}")
        given.append((call.label, list(call.value)))
    wrong = [(label, pieces, _split(word, merges))
             for (label, pieces), (word, merges) in zip(given, cases,
                                                        strict=True)
             if pieces != _split(word, merges)]
    if not wrong:
        return Verdict(True, f"{len(cases)} words split as the merges, in "
                             f"order, split them, BPE_CORPUS's bugs and "
                             f"hugbug included")
    if all(pieces and pieces[-1].endswith("_") for _, pieces in given):
        return SPLIT["d2l_marker"].verdict(wrong[0][0])
    for how in ("end_marker_missing", "first_only", "overlapping",
                "longest_match", "leftmost", "reversed", "string_replace",
                "marker_dropped", "right_to_left"):
        if all(pieces == _split(word, merges, how)
               for (_, pieces), (word, merges) in zip(given, cases,
                                                      strict=True)):
            name = {"leftmost": "not_in_order",
                    "reversed": "not_in_order"}.get(how, how)
            return SPLIT[name].verdict(wrong[0][0])
    label, pieces, _ = wrong[0]
    return Verdict(False, f"{label} gives {' '.join(pieces)}; apply each "
                          f"merge, in order, to every occurrence of its "
                          f"pair {see(SECTION, 1)}")


def check_bpe_split(pieces: list[str] | Callable) -> Verdict:
    """Exercise 1.3: the unseen word ``bugs`` split with the first three
    merges of BPE on ``BPE_CORPUS``, as a list of pieces. Exercise 1.5:
    a function ``fn(word, merges)`` that splits like chapter 1's
    ``bpe_split``, tried on several words and merges."""
    if callable(pieces):
        return _check_split_function(pieces)
    word = "bugs"
    merges = _bpe(BPE_CORPUS, 3)
    want = list(_words_after({word: 1}, merges)[0])
    if isinstance(pieces, str):
        return SPLIT["one_string"].verdict("pieces")
    if not isinstance(pieces, (list, tuple)) or not all(
            isinstance(p, str) for p in pieces):
        return Verdict(False, f"pieces should be a list of strings, got "
                              f"{type(pieces).__name__} "
                              f"{see(SECTION, 1)}")
    pieces = list(pieces)
    if pieces == want:
        return Verdict(True, f"{' '.join(pieces)}: ('b', 'ug</w>') "
                             f"joins only a bug at a word's end")
    if any(p.startswith("bugs") for p in pieces):
        return SPLIT["whole_word_unmade"].verdict("pieces")
    if any(p.startswith("bug") for p in pieces):
        return SPLIT["whole_word"].verdict("pieces")
    if any("</w>" in p for p in pieces[:-1]):
        return SPLIT["marker_inside"].verdict("pieces")
    if pieces == want[:-1]:
        return SPLIT["no_end_marker"].verdict("pieces")
    if pieces == [*want[:-2], want[-2] + want[-1]]:
        return SPLIT["marker_joined"].verdict("pieces")
    if pieces == [*word, "</w>"]:
        return SPLIT["unmerged"].verdict("pieces")
    if pieces and pieces[-1].endswith("_"):
        return SPLIT["d2l_marker"].verdict("pieces")
    made = {*word, "</w>", *("".join(m) for m in merges)}
    unmade = [p for p in pieces if p not in made and any(
        m in p for m in made if len(m) > 1)]  # "ugs": "ug" grown by "s"
    if unmade and "".join(pieces) == word + "</w>":
        return SPLIT["unmade_piece"].verdict(f"pieces ({unmade[0]!r})")
    if "".join(pieces) != word + "</w>":
        return Verdict(False, f"the pieces should spell {word} and then "
                              f"\"</w>\", got {''.join(pieces)!r}")
    return Verdict(False, f"pieces: apply the three merges, in order, to "
                          f"{' '.join([*word, '</w>'])} "
                          f"{see(SECTION, 1)}")


PAD_SCORES = catalogue(
    "check_pad_scores", 1,
    one_side=("that counts a pad on one side only: a pad is first in the "
              "pairs of its row and second in those of its column; "
              "count both, and the pairs of two pads once",
              "Padding sentences of different lengths"),
    pad_pad_twice=("the pairs of two pads are counted twice (once "
                   "as first, once as second), or the whole row is: its "
                   "pairs of two real tokens involve no pad",
                   "Padding sentences of different lengths"),
    pad_pad_only=("that counts only the pairs of two pads; a pair "
                  "of a pad and a real token involves a pad too",
                  "Padding sentences of different lengths"),
    no_pad=("that is the number of pairs with no pad at all; the "
            "question asks for those that involve a pad",
            "Padding sentences of different lengths"),
    share=("give the number of pairs, not their share",
           "Padding sentences of different lengths"),
    pad_pad_added=("the pairs of two pads were added instead of "
                   "subtracted: the pairs with a pad first and "
                   "those with a pad second both hold them, so "
                   "subtract them once (inclusion-exclusion)",
                   "Padding sentences of different lengths"),
    every_sentence=("that counts a pad's pairs in every sentence, but "
                    "only the last sentence has pads: the pairs of the "
                    "other three involve none",
                    "Padding sentences of different lengths"),
    query_rows_only=("that is all the pairs less those with a pad "
                     "first: it still counts the pairs with no pad; "
                     "count the pairs that involve a pad, first, "
                     "second or both", "Padding sentences of different "
                                        "lengths"),
    doubled=("that is twice the count: the L x L pairs are already "
             "ordered, so (pad, token) and (token, pad) are two pairs, "
             "each counted once; do not double the count",
             "Padding sentences of different lengths"),
    pads=("that is the number of pads, not of pairs: every pad has a "
          "row and a column of pairs", "Padding sentences of different "
                                        "lengths"),
    all_less_real_row=("that is all the pairs less the last sentence's "
                       "pairs of two real tokens: the other three "
                       "sentences have no pads, so none of their pairs "
                       "involve one", "Padding sentences of different "
                                      "lengths"),
    positions=("that is the number of positions, B x L, not of pairs: "
               "each sentence has L x L pairs, one per (first, "
               "second) token", "Padding sentences of different lengths"),
    real_tokens=("that is the number of real tokens, not of pairs that "
                 "involve a pad: every pad has a row and a column of "
                 "pairs", "Padding sentences of different lengths"),
    all_pairs=("that is every pair of the batch, 4 x 36; only the last "
               "sentence has pads: count those of its 36 pairs that "
               "involve one", "Padding sentences of different lengths"),
    batch_positions=("that pairs each of the 3 pads with all 24 "
                     "positions of the batch (or counts the last "
                     "sentence's 36 pairs twice); attention compares a "
                     "token only with the 6 of its own sentence",
                     "Padding sentences of different lengths"),
    batch_real=("that pairs each of the 3 pads with all 21 real tokens "
                "of the batch; attention compares a token only with the "
                "6 of its own sentence",
                "Padding sentences of different lengths"),
)


def _a_share(n: object) -> bool:
    """Whether ``n`` is a number strictly between 0 and 1 (a fraction,
    which no count of pairs can be)."""
    if isinstance(n, torch.Tensor) and n.numel() == 1:
        n = n.item()
    return (isinstance(n, int | float) and not isinstance(n, bool)
            and 0 < n < 1)


def check_pad_scores(n: int) -> Verdict:
    """Exercise 1.4: how many of the L x L pairs of tokens that attention
    compares in the padded batch of chapter 1 (the running example and
    ``"What is next?"``, (B, L) = (4, 6)) involve a pad, first, second
    or both."""
    texts = [*SENTENCES, "What is next?"]
    stoi = build_vocab(texts, specials=("<pad>",))
    ids, lengths = encode(texts, stoi, pad_id=0)
    real = ids != 0  # (B, L): a real token
    no_pad = real[:, :, None] & real[:, None, :]  # (B, L, L)
    total = no_pad.numel()
    want = total - int(no_pad.sum())
    pads = int((~real).sum())
    one_side = int((~real).sum() * ids.size(1))  # pads' rows only
    pad_pad = int(((~real).sum(1) ** 2).sum())  # between two pads
    last = no_pad[-1].numel()  # the last sentence's L x L pairs
    last_want = last - int(no_pad[-1].sum())
    problem = check_number("n", n, want, mistakes=[
        (PAD_SCORES["one_side"], one_side),
        (PAD_SCORES["pad_pad_twice"], 2 * one_side),
        (PAD_SCORES["pad_pad_only"], pad_pad),
        (PAD_SCORES["no_pad"], total - want),
        (PAD_SCORES["share"], want / total),
        (PAD_SCORES["share"], 100 * want / total),
        (PAD_SCORES["share"], last_want / last),  # of the last row: 3/4
        (PAD_SCORES["share"], 100 * last_want / last),
        (PAD_SCORES["all_less_real_row"], total - int(no_pad[-1].sum())),
        (PAD_SCORES["positions"], real.numel()),
        (PAD_SCORES["real_tokens"], int(real.sum())),
        (PAD_SCORES["pads"], pads),
        (PAD_SCORES["pad_pad_added"], 2 * one_side + pad_pad),
        (PAD_SCORES["every_sentence"], want * ids.size(0)),
        (PAD_SCORES["query_rows_only"], total - one_side),
        (PAD_SCORES["all_pairs"], total),
        (PAD_SCORES["doubled"], 2 * want),
        (PAD_SCORES["batch_positions"], pads * real.numel()),
        (PAD_SCORES["batch_real"], pads * int(real.sum())),
    ])
    if problem is not None and _a_share(n):  # 0 < n < 1: not a count
        return PAD_SCORES["share"].verdict(f"n = {float(n):.4g}")
    if problem is not None:
        return _pointed(problem, PADDING)
    return Verdict(True, f"{want} of the {total} pairs involve a pad: "
                         f"a larger share than the pads' {pads} of "
                         f"{real.numel()} positions")


BYTES = "Byte-level BPE: no text is unknown"
BYTE_IDS = catalogue(
    "check_byte_ids", 1,
    code_points=("ord() gives a character's code point (\u00ef is 239, "
                 "\u20ac is 8364), not its bytes: encode the text as "
                 "UTF-8 first, text.encode(\"utf-8\"), one id per byte",
                 BYTES),
    utf16=("those are UTF-16 bytes: the chapter, like GPT-2, encodes "
           "text as UTF-8, text.encode(\"utf-8\")", BYTES),
    latin1=("Latin-1 has no \u20ac and no emoji, and gives \u00ef one "
            "byte: encode the text as UTF-8, text.encode(\"utf-8\")",
            BYTES),
    nested=("that is one list per character: the ids of a text are one "
            "flat list, the bytes of every character one after the "
            "other", BYTES),
    bytes_pieces=("those are one-byte bytes objects, the pieces before "
                  "any merge, not their ids: an id is an int, the byte's "
                  "value; list(text.encode(\"utf-8\")) gives them",
                  BYTES),
    nfd=("the text was normalized first, to NFD or NFKD: that splits "
         "\u00ef into i and a combining diaeresis, so \"na\u00efve\" "
         "gives 7 bytes, not 6; the ids are those of the text as given, "
         "list(text.encode(\"utf-8\")), with no Unicode normalization",
         BYTES),
    nfkc=("the text was normalized first, to NFKC: that replaces the "
          "ligature \ufb01 (3 bytes) by the two letters f and i (2 "
          "bytes); the ids are those of the text as given, "
          "list(text.encode(\"utf-8\")), with no Unicode normalization",
          BYTES),
)
BYTE_TEXTS = ["the", " the", "\u20ac5", "na\u00efve",  # \u20ac: not Latin-1
              "\ufb01ne",  # the ligature fi: NFKC makes it f and i
              "\N{SLIGHTLY SMILING FACE}", ""]


def _byte_mistake(text: str, value: object) -> str | None:
    """The name of the catalogued mistake ``value`` shows for ``text``."""
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(v, (bytes, bytearray)) and len(v) == 1
            for v in value):
        return "bytes_pieces"
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(v, (list, tuple, bytes)) for v in value):
        return "nested"
    if value == [ord(c) for c in text]:
        return "code_points"
    if value == list(unicodedata.normalize("NFKC", text).encode("utf-8")):
        return "nfkc"  # before NFKD, which also splits the ligature
    if value in (list(unicodedata.normalize(form, text).encode("utf-8"))
                 for form in ("NFD", "NFKD")):
        return "nfd"
    for name, codec in (("utf16", "utf-16-le"), ("utf16", "utf-16"),
                        ("utf16", "utf-16-be")):
        if value == list(text.encode(codec)):
            return name
    return None


def check_byte_ids(fn: Callable[[str], list[int]]) -> Verdict:
    """Exercise 1.6: ``fn(text)``, the ids of ``text`` before any merge,
    one per UTF-8 byte, the byte's value (the chapter's numbering)."""
    for text in BYTE_TEXTS:
        call = attempt(fn, text, shown=repr(text))
        if call.verdict is not None:
            if isinstance(call.error, UnicodeEncodeError):
                return BYTE_IDS["latin1"].verdict(call.label)
            return call.verdict
        want, value = list(text.encode("utf-8")), call.value
        if isinstance(value, torch.Tensor):
            value = value.tolist()  # a 0-d tensor gives one number
        if isinstance(value, (bytes, bytearray)):
            value = list(value)
        if isinstance(value, str):
            return Verdict(False, f"{call.label} should return a list of "
                                  f"ints, got the string {value!r} "
                                  f"{see(BYTES, 1)}")
        if isinstance(value, tuple):
            value = list(value)
        if value == want:
            continue
        mistake = _byte_mistake(text, value)
        if mistake is not None:
            return BYTE_IDS[mistake].verdict(call.label)
        if isinstance(value, list) and value in (
                list(text.encode("latin-1", errors=errors))
                for errors in ("ignore", "replace")):
            return BYTE_IDS["latin1"].verdict(call.label)
        return Verdict(False, f"{call.label} gives {value!r}; want "
                              f"{want}, one id per UTF-8 byte "
                              f"{see(BYTES, 1)}")
    return Verdict(True, f"{len(BYTE_TEXTS)} texts: one id per UTF-8 byte, "
                         f"so \u00ef takes 2 ids, \u20ac and \ufb01 3, "
                         f"the emoji 4")
