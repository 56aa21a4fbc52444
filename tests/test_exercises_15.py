"""Chapter 15's checkers accept a right answer and refuse the usual wrong ones: for
Exercise 15.4, the previous-token head and the head that looks at the earlier twin itself
(one key too early) are named as such."""

import torch

from mha_lib.exercises import check_find_induction_head


def head_score(weights, k, offset):
    """Mean weight of the second copy's queries on key t - k + offset, per (N, H)."""
    num_layers, batch, num_heads, length, _ = weights.shape
    q = torch.arange(length)
    second = (q >= k) & (q < 2 * k - 1)
    target = (q - k + offset).clamp(min=0)
    index = target[None, :, None, :, None].expand(num_layers, batch, num_heads, length, 1)
    on_target = weights.gather(-1, index)[..., 0]
    return (on_target * second[:, None]).sum(dim=(1, 3))


def best(score):
    return divmod(score.argmax().item(), score.size(1))


def test_find_induction_head_checker():
    assert check_find_induction_head(lambda w, k: best(head_score(w, k, 1)))
    twin = check_find_induction_head(lambda w, k: best(head_score(w, k, 0)))
    assert not twin and "earlier twin itself" in twin.message
    previous = check_find_induction_head(
        lambda w, k: best(w.diagonal(-1, -2, -1).mean(dim=(1, 3))))
    assert not previous and "previous-token head" in previous.message
    fixed = check_find_induction_head(lambda w, k: (1, 2))  # right only once
    assert not fixed and "random" in fixed.message and "(2, 0)" not in fixed.message
    not_a_pair = check_find_induction_head(lambda w, k: None)
    assert not not_a_pair and "pair (layer, head)" in not_a_pair.message
    raising = check_find_induction_head(lambda w, k: w[99])
    assert not raising and "IndexError" in raising.message
