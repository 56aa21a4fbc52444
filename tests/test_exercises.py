"""Exercise checkers say Correct to right answers and Not yet to wrong ones.

The notebooks' stored solutions show the Correct side for every checker; these tests
show that the checkers can also say no (a checker that accepts anything is a defect).
"""

import torch

from mha_lib import build_vocab, encode, tokenize
from mha_lib.exercises import (
    SENTENCES,
    check_einsum_num_parameters,
    check_num_parameters,
    check_padded_batch,
    check_tokenizer,
    check_vocab,
)
from mha_lib.exercises.verdict import check_calls


def test_check_calls_reports_the_first_wrong_or_raising_call():
    square = lambda n: n * n  # noqa: E731
    assert check_calls(square, [(2,), (3,)], square, "ok")
    wrong = check_calls(lambda n: n + n, [(2,), (3,)], square, "ok")
    assert not wrong and "fn(3) should be 9, got 6" in repr(wrong)
    raising = check_calls(lambda n: 1 / 0, [(2,)], square, "ok")
    assert not raising and "ZeroDivisionError" in repr(raising)


def test_chapter_1_checkers():
    assert check_tokenizer(lambda text: tokenize(text.replace(",", "")))
    assert not check_tokenizer(tokenize)  # keeps "hello,"
    stoi = build_vocab(SENTENCES, specials=("<pad>",))
    assert check_vocab(stoi)
    assert not check_vocab(build_vocab(SENTENCES))  # no <pad>
    ids, lengths = encode(["What will come next?", "A basic split!"], stoi, pad_id=0)
    assert check_padded_batch(ids, lengths)
    assert not check_padded_batch(ids.flip(0), lengths.flip(0))
    assert not check_padded_batch(ids, torch.tensor([4, 4]))


def test_parameter_count_checkers():
    assert check_num_parameters(lambda d, h, bias: 4 * d * d + (4 * d if bias else 0))
    assert not check_num_parameters(lambda d, h, bias: 4 * d * d)
    assert check_einsum_num_parameters(
        lambda h, d, dk, dv: d * h * dk * 2 + h * dk * 2 + d * h * dv + h * dv
        + h * dv * d + d + 2 * d)
    assert not check_einsum_num_parameters(lambda h, d, dk, dv: 0)
