"""Checkers for chapter 9's exercises (the d2l variant: heads folded into
the batch)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from mha_lib.exercises.verdict import (
    Verdict,
    attempt,
    catalogue,
    check_tensor,
)
from mha_lib.masks import padding_mask
from mha_lib.mha import MultiHeadAttention
from mha_lib.variants import D2LMultiHeadAttention

__all__ = ["check_repeat_lens", "check_unfold_weights", "check_d2l_to_mha"]

_ONCE_PER_HEAD = "`valid_lens`, once per head"
_REPEAT = "The wrong way: `repeat`"
_TWO_D = "2-D `valid_lens`: one length per query"

REPEAT = catalogue(
    "check_repeat_lens", 9,
    tiled=("that is .repeat: the lengths cycle through the batch, but the "
           "folded rows are sample-major, row b*H + h is sentence b",
           _REPEAT),
    copying=("the exercise builds it with indexing, expand or reshape "
             "only, without repeat_interleave, repeat, tile or "
             "concatenated copies", _ONCE_PER_HEAD),
    head_axis_last=("for (B, Lq) lengths the head axis goes right after "
                    "the batch axis, not after Lq", _TWO_D),
    flattened=("2-D valid_lens keep their Lq axis: (B, Lq) -> (B*H, Lq)",
               _TWO_D),
    one_d_only=("that works for (B,) lengths only: valid_lens may also be "
                "(B, Lq), so keep the axes after the batch axis "
                "(valid_lens.shape[1:])", _TWO_D),
    float_lengths=("the lengths became floats: repeat_interleave keeps "
                   "the integer dtype of valid_lens; drop the .float()",
                   _ONCE_PER_HEAD),
)


def _explain_repeat(error: BaseException, record: object) -> object:
    """An answer written for 1-D lengths fails on 2-D ones."""
    return REPEAT["one_d_only"] if isinstance(
        error, (RuntimeError, IndexError, ValueError)) else None

_COPIES = (torch.repeat_interleave, torch.Tensor.repeat_interleave,
           torch.Tensor.repeat, torch.tile, torch.Tensor.tile, torch.cat,
           torch.concat, torch.concatenate, torch.stack, torch.hstack,
           torch.vstack)


def check_repeat_lens(
    fn: Callable[[torch.Tensor, int], torch.Tensor],
) -> Verdict:
    """Exercise 9.1: ``fn(valid_lens, num_heads)`` repeats each sample's
    lengths once per head, ``(B,) -> (B*H,)`` or ``(B, Lq) -> (B*H, Lq)``,
    like ``torch.repeat_interleave``, with indexing, ``expand`` or
    ``reshape`` only."""
    cases = (torch.tensor([6, 4, 3]), torch.tensor([2, 0]),
             torch.tensor([[1, 2, 3], [3, 3, 1]]))
    for valid_lens in cases:
        rest = valid_lens.shape[1:]
        for num_heads in (4, 1, 3):
            shown = f"{valid_lens.tolist()}, {num_heads}"
            call = attempt(fn, valid_lens.clone(), num_heads, shown=shown)
            if call.verdict is not None:
                mistake = (_explain_repeat(call.error, call.record)
                           if rest else None)
                if mistake is not None:  # the hint, not PyTorch's words
                    return mistake.verdict(
                        f"your {call.label} raised "
                        f"{type(call.error).__name__}")
                return call.verdict
            expected = torch.repeat_interleave(valid_lens,
                                               repeats=num_heads, dim=0)
            value = call.value
            if (isinstance(value, torch.Tensor)
                    and value.is_floating_point()
                    and value.shape == expected.shape
                    and torch.equal(value, expected.to(value.dtype))):
                return REPEAT["float_lengths"].verdict(call.label)
            problem = check_tensor(
                call.label, call.value, expected, atol=0, rtol=0,
                axes="(B*H,)" if not rest else "(B*H, Lq)", mistakes=[
                    (REPEAT["tiled"],
                     valid_lens.repeat(num_heads, *[1] * len(rest))),
                    (REPEAT["head_axis_last"], valid_lens[..., None].expand(
                        *valid_lens.shape, num_heads).reshape(-1, *rest)),
                    (REPEAT["flattened"], expected.flatten()),
                    (REPEAT["flattened"], valid_lens.flatten(
                        ).repeat_interleave(num_heads)),
                ])
            if problem is not None:
                return problem
            if call.record.used(*_COPIES):
                return REPEAT["copying"].verdict(call.label)
    return Verdict(
        True, "each length repeated num_heads times in a row: row b*H + h")


UNFOLD = catalogue(
    "check_unfold_weights", 9,
    head_major=("the rows are folded sample-major (row b*H + h is "
                "sentence b, head h), not head-major: reshape to "
                "(B, H, Lq, Lk) directly", "`transpose_qkv`: fold the "
                                           "heads into the batch"),
    swapped_lengths=("the last two axes stay (Lq, Lk), queries by keys: "
                     "only the first axis unfolds",
                     "`transpose_output`: unfold and concatenate"),
    transposed=("the weights are transposed: row i is query i, so each "
                "row sums to one", "Same numbers as chapter 8's module"),
)


def check_unfold_weights(
    fn: Callable[[torch.Tensor, int], torch.Tensor],
) -> Verdict:
    """Exercise 9.2: ``fn(weights, num_heads)`` turns d2l's
    ``(B*H, Lq, Lk)`` attention weights into the ``(B, H, Lq, Lk)`` layout
    of :class:`~mha_lib.MultiHeadAttention`."""
    generator = torch.Generator().manual_seed(9)
    for batch, heads, q_len, k_len in ((3, 4, 6, 6), (2, 3, 3, 5),
                                       (1, 2, 4, 1), (4, 2, 5, 5)):
        folded = torch.rand(batch * heads, q_len, k_len,
                            generator=generator).softmax(-1)
        call = attempt(fn, folded.clone(), heads,
                       shown=f"weights {tuple(folded.shape)}, {heads}")
        if call.verdict is not None:
            return call.verdict
        problem = check_tensor(
            call.label, call.value,
            folded.reshape(batch, heads, q_len, k_len),
            axes="(B, H, Lq, Lk)", atol=0.0, rtol=0.0, mistakes=[
                (UNFOLD["head_major"], folded.reshape(
                    heads, batch, q_len, k_len).transpose(0, 1)),
                (UNFOLD["head_major"],
                 folded.reshape(heads, batch, q_len, k_len)),
                (UNFOLD["swapped_lengths"],
                 folded.reshape(batch, heads, k_len, q_len)),
                (UNFOLD["transposed"], folded.reshape(
                    batch, heads, q_len, k_len).transpose(-2, -1)),
            ])
        if problem is not None:
            return problem
    return Verdict(
        True, "row b*H + h of the folded weights is sentence b, head h")


_SAME = "Same numbers as chapter 8's module"

D2L = catalogue(
    "check_d2l_to_mha", 9,
    transposed=("the weights were transposed: both modules use nn.Linear, "
                "(out, in); copy them as they are", _SAME),
    swapped=("the layers are mixed up: W_q -> q_proj, W_k -> k_proj, "
             "W_v -> v_proj, W_o -> out_proj", _SAME),
    not_copied=("a layer was not copied: all four, W_o -> out_proj "
                "included", _SAME),
    extra_bias=("the new module has biases the d2l module does not have: "
                "MultiHeadAttention(..., bias=False) when d2l.W_q.bias is "
                "None", _SAME),
    no_bias=("the new module has no biases, but the d2l module has: "
             "MultiHeadAttention(..., bias=d2l.W_q.bias is not None)",
             _SAME),
    bias_not_copied=("the biases were not copied: load_state_dict or "
                     "copy_ copies weight and bias together", _SAME),
    num_heads=("the number of heads differs: take d2l.num_heads", _SAME),
    hard_coded=("the sizes are hard-coded: read them from the module "
                "(d2l.W_o.out_features, d2l.num_heads), which may have "
                "any size", _SAME),
    shared=("the returned module holds d2l's own layers, not copies: "
            "training either would change both; copy the weights into "
            "the new module's layers (load_state_dict or copy_)", _SAME),
)


def _explain_d2l(error: BaseException, record: object) -> object:
    """A module built for one size, or with(out) biases, loaded with
    another: load_state_dict names the bias key it missed or found."""
    if not isinstance(error, RuntimeError):
        return None
    text = str(error)
    if "Unexpected key(s)" in text and "bias" in text:
        return D2L["no_bias"]
    if "Missing key(s)" in text and "bias" in text:
        return D2L["extra_bias"]
    return D2L["hard_coded"] if "size" in text else None

_PAIRS = (("W_q", "q_proj"), ("W_k", "k_proj"), ("W_v", "v_proj"),
          ("W_o", "out_proj"))


def _compare_layers(d2l: D2LMultiHeadAttention,
                    mha: MultiHeadAttention) -> Verdict | None:
    """Name the layer that was not copied right, from the parameters."""
    weights = {old: getattr(d2l, old).weight.detach() for old, _ in _PAIRS}
    for old, new in _PAIRS:
        layer = getattr(mha, new, None)
        if layer is getattr(d2l, old) or (
                isinstance(layer, torch.nn.Linear)
                and layer.weight is getattr(d2l, old).weight):
            return D2L["shared"].verdict(new)
        if not isinstance(layer, torch.nn.Linear):
            return Verdict(False, f"the returned module has no nn.Linear "
                                  f"{new}")
        given, want = layer.weight.detach(), weights[old]
        if given.shape == want.shape and torch.equal(given, want):
            bias = getattr(d2l, old).bias
            if bias is None and layer.bias is not None \
                    and layer.bias.detach().abs().max() > 0:
                return D2L["extra_bias"].verdict(new)
            if bias is not None and layer.bias is None:
                return D2L["no_bias"].verdict(new)
            if bias is not None and (not torch.equal(
                    layer.bias.detach(), bias.detach())):
                return D2L["bias_not_copied"].verdict(new)
            continue
        if given.shape == want.T.shape and torch.equal(given, want.T):
            return D2L["transposed"].verdict(f"{new}.weight")
        if any(given.shape == w.shape and torch.equal(given, w)
               for w in weights.values()):
            return D2L["swapped"].verdict(f"{new}.weight")
        return D2L["not_copied"].verdict(f"{new}.weight")
    return None


def check_d2l_to_mha(
    fn: Callable[[D2LMultiHeadAttention], MultiHeadAttention],
) -> Verdict:
    """Exercise 9.3: ``fn(d2l)`` returns a
    :class:`~mha_lib.MultiHeadAttention` with the weights of ``d2l`` (a
    :class:`~mha_lib.D2LMultiHeadAttention` whose sizes all equal
    ``num_hiddens``), so that
    ``mha(x, mask=padding_mask(valid_lens))[0]`` equals
    ``d2l(x, x, x, valid_lens)``, in training and in eval mode."""
    generator = torch.Generator().manual_seed(90)
    for num_hiddens, num_heads, bias in ((8, 4, False), (12, 3, False),
                                         (6, 2, True)):
        # leave the reader's random state alone
        with torch.random.fork_rng():
            torch.manual_seed(num_hiddens)
            d2l = D2LMultiHeadAttention(
                num_hiddens, num_hiddens, num_hiddens, num_hiddens,
                num_heads, dropout=0.0, bias=bias).eval()
        call = attempt(fn, d2l,
                       shown=f"d2l with num_hiddens={num_hiddens}, "
                             f"num_heads={num_heads}, bias={bias}")
        if call.verdict is not None:
            mistake = _explain_d2l(call.error, call.record)
            if mistake is not None:  # the hint, not PyTorch's words
                return mistake.verdict(f"your {call.label} raised "
                                       f"{type(call.error).__name__}")
            return call.verdict
        mha = call.value
        if not isinstance(mha, MultiHeadAttention):
            return Verdict(
                False, f"{call.label} should return a "
                       f"mha_lib.MultiHeadAttention, got "
                       f"{type(mha).__name__}")
        if mha.d_model != num_hiddens:
            return D2L["hard_coded"].verdict(call.label)
        if mha.num_heads != num_heads:
            return D2L["num_heads"].verdict(call.label)
        problem = _compare_layers(d2l, mha)
        if problem is not None:
            return problem
        x = torch.randn(3, 5, num_hiddens, generator=generator)
        for valid_lens in (torch.tensor([5, 3, 2]),
                           torch.tensor([[1, 2, 3, 4, 5]] * 3)):
            with torch.no_grad():
                want = d2l(x, x, x, valid_lens)
            for training in (False, True):
                mask = padding_mask(valid_lens, 5)
                run = attempt(mha.train(training), x, mask=mask,
                              shown=f"x {tuple(x.shape)}, mask")
                if run.verdict is not None:
                    return run.verdict
                problem = check_tensor(
                    f"the output of the returned module "
                    f"(num_hiddens={num_hiddens}, bias={bias}, "
                    f"valid_lens {tuple(valid_lens.shape)}, "
                    f"{'training' if training else 'eval'})",
                    run.value[0], want)
                if problem is not None:
                    return problem
    return Verdict(
        True, "W_q, W_k, W_v, W_o -> q_proj, k_proj, v_proj, out_proj")
