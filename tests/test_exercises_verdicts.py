"""How every checker talks to the reader: an error in the reader's code is
reported as the reader's (never a traceback from inside the checker), an
answer of the wrong type or shape gets a ``Not yet`` that says what was
expected, and a wrong number is never answered with the right one."""

from __future__ import annotations

import inspect

import pytest
import torch

import mha_lib.exercises as exercises
from mha_lib.exercises.verdict import (
    Verdict,
    attempt,
    check_number,
    check_tensor,
    source_names,
)

CHECKERS = [n for n in exercises.__all__ if n.startswith("check_")]
# the checkers that take the reader's function as their only argument
TAKE_A_FUNCTION = [n for n in CHECKERS
                   if list(inspect.signature(getattr(exercises, n)).parameters)
                   == ["fn"]]


def test_most_checkers_take_a_function():
    assert len(TAKE_A_FUNCTION) >= 44


def _raises(*args, **kwargs):
    raise ValueError("boom")


@pytest.mark.parametrize("checker", TAKE_A_FUNCTION)
def test_an_error_in_the_readers_code_is_the_readers_message(checker):
    verdict = getattr(exercises, checker)(_raises)
    assert not verdict
    assert "raised ValueError: boom" in verdict.message
    assert "your " in verdict.message


JUNK = [None, 0, "x", torch.zeros(1), torch.zeros(()), torch.zeros(2, 3),
        (torch.zeros(1), torch.zeros(1)), [1.0, 2.0]]


@pytest.mark.parametrize("checker", TAKE_A_FUNCTION)
def test_a_wrong_type_or_shape_is_a_not_yet_never_an_exception(checker):
    for junk in JUNK:
        verdict = getattr(exercises, checker)(lambda *args, junk=junk: junk)
        assert isinstance(verdict, Verdict) and not verdict, (checker, junk)
        assert "Traceback" not in verdict.message


def test_a_wrong_shape_names_the_axes():
    verdict = exercises.check_absorbed_query(lambda q, w, h: q[..., :1])
    assert not verdict
    assert "expected shape (B, H, L, C)" in verdict.message
    assert "mat1 and mat2" not in verdict.message  # not the checker's own product
    merged = exercises.check_merge_heads(lambda x: x)
    assert "expected shape (B, L, H*D) = (3, 6, 8), got (3, 4, 6, 2)" in merged.message


def test_the_data_checkers_refuse_junk_without_raising():
    for checker, args in (
            ("check_vocab", (None,)), ("check_vocab", ({"a": 1},)),
            ("check_padded_batch", (None, None)),
            ("check_padded_batch", (torch.zeros(2, 4), torch.zeros(3))),
            ("check_bpe_merges", (None,)), ("check_bpe_merges", ([1, 2, 3],)),
            ("check_bpe_merges", ([("u", "g", "x")],)),
            ("check_padding_embedding", (None, None)),
            ("check_embedding_parameters", ("many",)),
            ("check_embedding_parameters", (True,)),
            ("check_shift_matrix", (torch.eye(3),)),
            ("check_projection_parameters", (None,)),
            ("check_masked_self_attention", (None, None, None, None))):
        verdict = getattr(exercises, checker)(*args)
        assert isinstance(verdict, Verdict) and not verdict, (checker, args)


# (checker, a wrong answer, the right number in the forms it might be printed)
NUMBERS = [
    ("check_embedding_parameters", 38597375, 38597376),
    ("check_projection_parameters", 787000, 787968),
    ("check_num_parameters", lambda d, h, b: 1000, 288),  # (8, 4, True)
    ("check_einsum_num_parameters", lambda h, d, k, v: 1, 612),  # (4, 8, 3, 5)
    ("check_block_params", lambda d, f: 1, 880),  # (8, 32)
    ("check_cache_bytes", lambda *a: 1, 20160),  # (5, 3, 4, 6, 7, 4)
    ("check_latent_cache_bytes", lambda *a: 1, 320),  # (6, 2, 5, 2, 4)
    ("check_unturned_pairs", lambda d, b, n: 2, 4),  # (8, 10000.0, 6); 1 is the share
]


@pytest.mark.parametrize("checker, wrong, right", NUMBERS,
                         ids=[n[0] for n in NUMBERS])
def test_a_wrong_number_is_not_answered_with_the_right_one(checker, wrong, right):
    verdict = getattr(exercises, checker)(wrong)
    assert not verdict
    for shown in (str(right), f"{right:,}"):
        assert f" {shown}" not in verdict.message and f"{shown} " not in \
            verdict.message, verdict.message
    assert "too small" in verdict.message or "too large" in verdict.message


def test_how_far_off_and_in_which_direction():
    # coarse bands: the right number cannot be worked out from the message
    assert "2 to 10 times too large" in check_number("n", 20, 10).message
    assert "10 to 100 times too small" in check_number("n", 5, 100).message
    assert "too small, by 1 to 10 %" in check_number("n", 95, 100).message
    assert "too large, by less than 1 %" in check_number("n", 1001, 1000).message
    assert "should be a number" in check_number("n", "10", 10).message
    assert check_number("n", 10.0, 10) is None
    ratio = check_tensor("t", torch.ones(3) * 2.5, torch.ones(3))
    assert "2.5 times the right values" in ratio.message
    shifted = check_tensor("t", torch.arange(3.0) + 1, torch.arange(3.0))
    assert "off by the same amount everywhere (+1)" in shifted.message
    nan = check_tensor("t", torch.tensor([1.0, float("nan")]), torch.ones(2))
    assert "NaN or inf" in nan.message
    mask = check_tensor("m", torch.tensor([True, True]), torch.tensor([True, False]))
    assert "1 of 2 entries is wrong, the first at index [1]" in mask.message
    # the expected values themselves are never printed
    values = check_tensor("t", torch.tensor([1.0, 7.0]), torch.tensor([1.0, 3.25]))
    assert "3.25" not in values.message and "too large" in values.message


def test_attempt_names_the_call_and_records_the_torch_functions():
    def attention(q, k, num_heads):
        return torch.softmax(q @ k.mT, dim=-1)

    call = attempt(attention, torch.zeros(2, 3), torch.zeros(4, 3), 2)
    assert call.verdict is None
    assert call.label == "attention(q (2, 3), k (4, 3), 2)"
    assert call.record.used(torch.softmax)
    failed = attempt(attention, torch.zeros(2, 3), torch.zeros(4, 5), 2)
    assert not failed.verdict
    assert failed.verdict.message.startswith("your attention(q (2, 3), k (4, 5), 2) "
                                             "raised RuntimeError")


def test_source_names_sees_the_readers_code():
    def chunk(q_len, past):
        return torch.ones(q_len, past + q_len).tril(past)  # tril, not arange

    assert {"tril", "ones"} <= source_names(chunk)
    assert "chunk" not in source_names(chunk)
    assert source_names(len) == set()  # no source: nothing to say


def test_slopes_close_but_not_right_never_hear_one_times():
    from mha_lib.alibi import alibi_slopes
    off = exercises.check_alibi_slopes(
        lambda n: [s * (1 + 1e-4) for s in alibi_slopes(n)])
    assert not off and "1 times" not in off.message, off.message
    assert "float32 rounding" in off.message
