"""Checkers for chapter 9's exercises (the d2l variant: heads folded into
the batch)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from mha_lib.exercises.verdict import Verdict, close
from mha_lib.masks import padding_mask
from mha_lib.mha import MultiHeadAttention
from mha_lib.variants import D2LMultiHeadAttention

__all__ = ["check_repeat_lens", "check_unfold_weights", "check_d2l_to_mha"]


def check_repeat_lens(
    fn: Callable[[torch.Tensor, int], torch.Tensor],
) -> Verdict:
    """Exercise 9.1: ``fn(valid_lens, num_heads)`` repeats each sample's
    lengths once per head, ``(B,) -> (B*H,)`` or ``(B, Lq) -> (B*H, Lq)``,
    like ``torch.repeat_interleave``."""
    cases = (torch.tensor([6, 4, 3]), torch.tensor([2, 0]),
             torch.tensor([[1, 2, 3], [3, 3, 1]]))
    for valid_lens in cases:
        for num_heads in (4, 1, 3):
            call = f"fn({valid_lens.tolist()}, {num_heads})"
            try:
                given = fn(valid_lens.clone(), num_heads)
            except Exception as error:
                # the reader's code: report it, do not crash the notebook
                return Verdict(
                    False, f"{call} raised "
                           f"{type(error).__name__}: {error}")
            expected = torch.repeat_interleave(valid_lens,
                                               repeats=num_heads, dim=0)
            if (not isinstance(given, torch.Tensor)
                    or given.shape != expected.shape):
                shape = (tuple(given.shape)
                         if isinstance(given, torch.Tensor)
                         else type(given).__name__)
                return Verdict(
                    False, f"{call} should have shape "
                           f"{tuple(expected.shape)}, got {shape}")
            if not torch.equal(given, expected):
                hint = ""
                cycled = valid_lens.repeat(
                    num_heads, *[1] * (valid_lens.dim() - 1))
                if torch.equal(given, cycled):
                    hint = (" (that is .repeat: the lengths cycle through "
                            "the batch, but the folded rows are "
                            "sample-major, b*H + h)")
                return Verdict(
                    False, f"{call} should be {expected.tolist()}, "
                           f"got {given.tolist()}{hint}")
    return Verdict(
        True, "each length repeated num_heads times in a row: row b*H + h")


def check_unfold_weights(
    fn: Callable[[torch.Tensor, int], torch.Tensor],
) -> Verdict:
    """Exercise 9.2: ``fn(weights, num_heads)`` turns d2l's
    ``(B*H, Lq, Lk)`` attention weights into the ``(B, H, Lq, Lk)`` layout
    of :class:`MultiHeadAttention`."""
    generator = torch.Generator().manual_seed(9)
    for batch, heads, q_len, k_len in ((3, 4, 6, 6), (2, 3, 3, 5),
                                       (1, 2, 4, 1)):
        folded = torch.rand(batch * heads, q_len, k_len,
                            generator=generator)
        call = f"fn(weights of shape {tuple(folded.shape)}, {heads})"
        try:
            given = fn(folded.clone(), heads)
        except Exception as error:
            # the reader's code: report it, do not crash the notebook
            return Verdict(
                False, f"{call} raised {type(error).__name__}: {error}")
        expected = folded.reshape(batch, heads, q_len, k_len)
        swapped = folded.reshape(heads, batch, q_len, k_len).transpose(0, 1)
        if (isinstance(given, torch.Tensor)
                and given.shape == expected.shape
                and batch > 1 and torch.equal(given, swapped)):
            return Verdict(
                False, "the rows are folded sample-major (row b*H + h), "
                       "not head-major: reshape to (B, H, Lq, Lk) directly")
        verdict = close(call, given, expected, "", atol=0.0, rtol=0.0)
        if not verdict:
            return verdict
    return Verdict(
        True, "row b*H + h of the folded weights is sentence b, head h")


def check_d2l_to_mha(
    fn: Callable[[D2LMultiHeadAttention], MultiHeadAttention],
) -> Verdict:
    """Exercise 9.3: ``fn(d2l)`` returns a :class:`MultiHeadAttention` with
    the weights of ``d2l`` (a :class:`D2LMultiHeadAttention` whose sizes all
    equal ``num_hiddens``), so that
    ``mha(x, mask=padding_mask(valid_lens))[0]`` equals
    ``d2l(x, x, x, valid_lens)``."""
    generator = torch.Generator().manual_seed(90)
    for num_hiddens, num_heads, bias in ((8, 4, False), (12, 3, False),
                                         (6, 2, True)):
        # leave the reader's random state alone
        with torch.random.fork_rng():
            torch.manual_seed(num_hiddens)
            d2l = D2LMultiHeadAttention(
                num_hiddens, num_hiddens, num_hiddens, num_hiddens,
                num_heads, dropout=0.0, bias=bias).eval()
        try:
            mha = fn(d2l)
        except Exception as error:
            # the reader's code: report it, do not crash the notebook
            return Verdict(
                False, f"fn(d2l with num_hiddens={num_hiddens}, "
                       f"bias={bias}) raised "
                       f"{type(error).__name__}: {error}")
        if not isinstance(mha, MultiHeadAttention):
            return Verdict(
                False, f"fn should return a mha_lib.MultiHeadAttention, "
                       f"got {type(mha).__name__}")
        x = torch.randn(3, 5, num_hiddens, generator=generator)
        for valid_lens in (torch.tensor([5, 3, 2]),
                           torch.tensor([[1, 2, 3, 4, 5]] * 3)):
            with torch.no_grad():
                want = d2l(x, x, x, valid_lens)
                try:
                    given, _ = mha.eval()(x,
                                          mask=padding_mask(valid_lens, 5))
                except Exception as error:
                    # the reader's module: report, do not crash
                    return Verdict(
                        False, f"the returned module raised "
                               f"{type(error).__name__}: {error}")
            verdict = close(
                f"its output (num_hiddens={num_hiddens}, bias={bias}, "
                f"valid_lens {tuple(valid_lens.shape)})", given, want, "")
            if not verdict:
                return verdict
    return Verdict(
        True, "W_q, W_k, W_v, W_o -> q_proj, k_proj, v_proj, out_proj")
