"""Checkers for chapter 11's exercises (checking against PyTorch)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from mha_lib.exercises.verdict import (
    Verdict,
    attempt,
    calls_to,
    catalogue,
    check_tensor,
    source_names,
)
from mha_lib.heads import split_heads
from mha_lib.interop import to_torch_mha
from mha_lib.masks import causal_mask, padding_mask
from mha_lib.mha import MultiHeadAttention

__all__ = ["check_to_torch", "check_torch_masks", "check_sdpa_attention"]

_INSIDE = "Inside `nn.MultiheadAttention`"
_ORDER = "The wrong way: the wrong order"
_MASKS = "Masks: mind the opposite meaning"
_UVA = "Another fused layout: UvA's per-head `qkv_proj`"
_FUNCTIONAL = "PyTorch's functional core: the same convention as ours"


def _module(
    d_model: int, num_heads: int, bias: bool, seed: int
) -> MultiHeadAttention:
    with torch.random.fork_rng():  # leave the reader's random state alone
        torch.manual_seed(seed)
        module = MultiHeadAttention(d_model, num_heads, bias=bias)
        if bias:  # biases far from zero, so a forgotten one shows
            with torch.no_grad():
                for p in module.parameters():
                    if p.dim() == 1:
                        p.uniform_(-1.0, 1.0)
        return module


def _run_both_modes(module: nn.Module, *args, **kwargs) -> list:
    """``module(*args)`` in training mode with gradients, then in eval mode
    without (``nn.MultiheadAttention`` takes another path there)."""
    results = []
    for training in (True, False):
        module.train(training)
        with torch.set_grad_enabled(training), warnings.catch_warnings():
            # a guard: check_torch_masks refuses a bool mask with a float
            # one (PyTorch warns that mixing the kinds is deprecated)
            warnings.filterwarnings("ignore", "Support for mismatched")
            results.append(attempt(module, *args, **kwargs))
    return results


TO_TORCH = catalogue(
    "check_to_torch", 11,
    order=("in_proj_weight stacks the input projections in the order q, "
           "k, v: another order fits the shapes and gives wrong numbers",
           _ORDER),
    transposed=("the weights were transposed: nn.MultiheadAttention's "
                "in_proj_weight holds W_q, W_k, W_v as nn.Linear stores "
                "them, (out, in)", _INSIDE),
    stacked_wrong_axis=("stack the three (d_model, d_model) weights along "
                        "dim 0, into (3 d_model, d_model)", _INSIDE),
    cat_dim1=("the three weights were concatenated along dim 1 (their "
              "columns) and reshaped: that interleaves the rows of W_q, "
              "W_k and W_v; concatenate along dim 0, torch.cat([W_q, W_k, "
              "W_v]), which is already (3 d_model, d_model)", _INSIDE),
    unknown_rows=("it does not hold the weights of q_proj, k_proj and "
                  "v_proj: rows 0..d-1 are W_q, d..2d-1 W_k, "
                  "2d..3d-1 W_v, each as nn.Linear stores it (out, in)",
                  _INSIDE),
    out_proj=("out_proj was not copied", _INSIDE),
    out_proj_transposed=("out_proj.weight was copied transposed: both "
                         "modules store it as nn.Linear does, (out, in); "
                         "copy it as it is", _INSIDE),
    biases=("the biases were not copied: in_proj_bias = cat of the "
            "three biases, and out_proj.bias", _INSIDE),
    made_without_bias=("the module was made with bias=False, but m has "
                       "biases: make it with bias=True (m.q_proj.bias is "
                       "not None) and copy them", _INSIDE),
    made_with_bias=("m has no biases, but the module was made with "
                    "bias=True: its zero biases give the same numbers, "
                    "yet it has parameters m lacks; make it with "
                    "bias=m.q_proj.bias is not None", _INSIDE),
    in_proj_bias=("in_proj_bias was not copied (out_proj.bias was): it is "
                  "cat([q_proj.bias, k_proj.bias, v_proj.bias])", _INSIDE),
    out_proj_bias=("out_proj.bias was not copied (in_proj_bias was)",
                   _INSIDE),
    per_head=("in_proj_weight holds q, k and v head by head, UvA's "
              "qkv_proj layout (h three d); nn.MultiheadAttention wants "
              "all queries, then all keys, then all values: (three h d), "
              "cat([W_q, W_k, W_v])", _UVA),
    no_grad=("copy_ into a parameter that requires a gradient is refused: "
             "copy inside with torch.no_grad():", _INSIDE),
    batch_first=("make it with batch_first=True, so that it takes "
                 "(B, L, d_model) like mha_lib", _INSIDE),
    library=("that calls to_torch_mha; the exercise copies the weights "
             "by hand", _INSIDE),
)


def _explain_to_torch(error: BaseException, record) -> object:
    if "leaf Variable that requires grad" in str(error):
        return TO_TORCH["no_grad"]
    return TO_TORCH["stacked_wrong_axis"] \
        if "size" in str(error) or "shape" in str(error) else None


def _per_head(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """PyTorch's rows (three h d) in UvA's order (h three d)."""
    return (weight.unflatten(0, (3, num_heads, -1)).transpose(0, 1)
            .flatten(0, 2))


def _in_proj_problem(m: MultiHeadAttention,
                     t: nn.MultiheadAttention) -> Verdict | None:
    """Name what was copied wrong, from the parameters."""
    w = {"q": m.q_proj.weight, "k": m.k_proj.weight, "v": m.v_proj.weight}
    given = t.in_proj_weight
    if given is None or given.shape != (3 * m.d_model, m.d_model):
        return TO_TORCH["stacked_wrong_axis"].verdict("in_proj_weight")
    given = given.detach()
    right = torch.cat([w["q"], w["k"], w["v"]]).detach()
    if not torch.equal(given, right):
        for order in ("qvk", "kqv", "kvq", "vqk", "vkq"):
            if torch.equal(given, torch.cat([w[c] for c in order])):
                return TO_TORCH["order"].verdict("in_proj_weight")
        transposed = torch.cat([w[c].T for c in "qkv"]).detach()
        if torch.equal(given, transposed):
            return TO_TORCH["transposed"].verdict("in_proj_weight")
        if torch.equal(given, _per_head(right, m.num_heads)):
            return TO_TORCH["per_head"].verdict("in_proj_weight")
        for wrong in (torch.cat([w[c] for c in "qkv"], dim=1),
                      torch.stack([w[c] for c in "qkv"], dim=1),
                      torch.stack([w[c] for c in "qkv"], dim=2)):
            if torch.equal(given, wrong.detach().reshape(given.shape)):
                return TO_TORCH["cat_dim1"].verdict("in_proj_weight")
        return TO_TORCH["unknown_rows"].verdict("in_proj_weight")
    if not torch.equal(t.out_proj.weight.detach(),
                       m.out_proj.weight.detach()):
        if torch.equal(t.out_proj.weight.detach(),
                       m.out_proj.weight.detach().T):
            return TO_TORCH["out_proj_transposed"].verdict(
                "out_proj.weight")
        return TO_TORCH["out_proj"].verdict("out_proj.weight")
    if m.q_proj.bias is not None:
        if t.in_proj_bias is None:
            return TO_TORCH["made_without_bias"].verdict("in_proj_bias")
        bias = torch.cat([m.q_proj.bias, m.k_proj.bias, m.v_proj.bias])
        in_ok = torch.equal(t.in_proj_bias.detach(), bias.detach())
        out_ok = t.out_proj.bias is not None and torch.equal(
            t.out_proj.bias.detach(), m.out_proj.bias.detach())
        if not in_ok and not out_ok:
            return TO_TORCH["biases"].verdict("in_proj_bias")
        if not in_ok:
            return TO_TORCH["in_proj_bias"].verdict("in_proj_bias")
        if not out_ok:
            return TO_TORCH["out_proj_bias"].verdict("out_proj.bias")
    elif t.in_proj_bias is not None:
        return TO_TORCH["made_with_bias"].verdict("in_proj_bias")
    return None


def check_to_torch(
    fn: Callable[[MultiHeadAttention], nn.MultiheadAttention],
) -> Verdict:
    """Exercise 11.1: ``fn(m)`` returns an
    ``nn.MultiheadAttention(batch_first=True)`` with the weights of ``m``
    (written by hand, without :func:`~mha_lib.to_torch_mha`), the same in
    training and in eval mode."""
    if fn is to_torch_mha or "to_torch_mha" in source_names(fn):
        return TO_TORCH["library"].verdict()
    generator = torch.Generator().manual_seed(11)
    for d_model, num_heads, bias in ((8, 4, True), (12, 3, False),
                                     (6, 1, True)):
        m = _module(d_model, num_heads, bias, seed=d_model)
        call = attempt(fn, m, shown=f"MultiHeadAttention({d_model}, "
                                    f"{num_heads}, bias={bias})",
                       explain=_explain_to_torch)
        if call.verdict is not None:
            return call.verdict
        t = call.value
        if not isinstance(t, nn.MultiheadAttention):
            return Verdict(
                False, f"{call.label} should return an "
                       f"nn.MultiheadAttention, got {type(t).__name__}")
        if not t.batch_first:
            return TO_TORCH["batch_first"].verdict(call.label)
        problem = _in_proj_problem(m, t)
        if problem is not None:
            return problem
        query = torch.randn(3, 4, d_model, generator=generator)
        memory = torch.randn(3, 6, d_model, generator=generator)
        for key in (query, memory):  # self- and cross-attention
            with torch.no_grad():
                want, _ = m(query, key, key)
            for run in _run_both_modes(t, query, key, key,
                                       shown="query, key, value"):
                if run.verdict is not None:
                    return run.verdict
                problem = check_tensor(
                    f"the returned module's output (d_model={d_model}, "
                    f"bias={bias}, Lk={key.size(1)}, "
                    f"{'training' if t.training else 'eval'})",
                    run.value[0], want)
                if problem is not None:
                    return problem
    return Verdict(
        True, "in_proj_weight = cat([W_q, W_k, W_v]), out_proj copied")


TORCH_MASKS = catalogue(
    "check_torch_masks", 11,
    padding_polarity=("key_padding_mask is True on the real tokens: "
                      "nn.MultiheadAttention reads True as 'ignore this "
                      "key', so invert it", _MASKS),
    causal_polarity=("attn_mask is True on the allowed keys: "
                     "nn.MultiheadAttention reads True as 'not allowed', "
                     "so invert it", _MASKS),
    padding_shape=("key_padding_mask is (B, Lk), one row per sentence: "
                   "drop the two broadcast axes of padding_mask (a 4-D one "
                   "slips through only on PyTorch's eval fast path, with "
                   "an attn_mask beside it; training refuses it)", _MASKS),
    lengths=("key_padding_mask is a (B, Lk) mask, not the lengths: "
             "~padding_mask(valid_lens, length)[:, 0, 0], True = blocked",
             _MASKS),
    batched_attn_mask=("attn_mask is (L, L), shared by the batch, or "
                       "(B * num_heads, L, L), one per sentence and head "
                       "(num_heads = 4 in this check)", _MASKS),
    per_head_order=("attn_mask's (B * num_heads, L, L) rows are head by "
                    "head (.repeat(num_heads, 1, 1)): PyTorch reads row "
                    "b * num_heads + h as sentence b, head h; repeat each "
                    "sentence's mask num_heads times in a row, "
                    ".repeat_interleave(num_heads, dim=0)", _MASKS),
    causal_missing=("the causal mask is missing: only the pads are "
                    "blocked, so each token sees the tokens after it; "
                    "attn_mask = ~causal_mask(length), True = blocked",
                    _MASKS),
    padding_missing=("the padding mask is missing: only the future is "
                     "blocked, so the real tokens see the pads; "
                     "key_padding_mask = ~valid, (B, Lk), True = blocked",
                     _MASKS),
    no_masks=("both masks are None: nothing is blocked; key_padding_mask "
              "= ~valid and attn_mask = ~causal, True = blocked", _MASKS),
    int_mask=("an integer mask: nn.MultiheadAttention takes bool or float "
              "masks only, so convert it, and mind the polarity: True = "
              "blocked, so Hugging Face's attention_mask (1 = real "
              "token) becomes key_padding_mask = attention_mask == 0",
              _MASKS),
    swapped=("the pair is (key_padding_mask, attn_mask), in that order",
             _MASKS),
    diagonal=("attn_mask also blocks the diagonal: a token may attend "
              "itself, so block only j > i", _MASKS),
    causal_transposed=("attn_mask is transposed: it blocks the past (j < "
                       "i), not the future; row i is query i and column j "
                       "key j, so block j > i, ~causal_mask(L)", _MASKS),
    float_mask=("a float mask is added to the scores, so a 0/1 mask blocks "
                "nothing (and ~ does not invert a float tensor): keep the "
                "bool masks and invert them, ~valid and ~causal", _MASKS),
    mixed_kinds=("one mask is bool and the other float: PyTorch warns "
                 "that mixing the kinds is deprecated; give both in one "
                 "kind, the bool pair ~valid and ~causal (True = "
                 "blocked), or both additive (-inf where blocked)",
                 _MASKS),
)


def _explain_float_mask(error: BaseException, record) -> object:
    return TORCH_MASKS["float_mask"] if "invert" in str(error) else None


def _allowed(mask: torch.Tensor | None, shape: tuple[int, ...],
             view: Callable[[torch.Tensor], torch.Tensor],
             ) -> torch.Tensor | None:
    """Where a mask in PyTorch's convention lets a query attend (True =
    may attend, bool or additive float), viewed as (B, H, Lq, Lk); None
    when it is not a tensor of that ``shape``."""
    if mask is None:
        return torch.ones((), dtype=torch.bool)
    if not isinstance(mask, torch.Tensor) or mask.shape != shape:
        return None
    # a float mask blocks where it is -inf or a large negative fill
    blocked = mask < -1e4 if mask.is_floating_point() else mask.bool()
    return ~view(blocked)


def _missing_mask(key_padding_mask: object, attn_mask: object,
                  valid: torch.Tensor, causal: torch.Tensor,
                  heads: int) -> Verdict | None:
    """The catalogued mistake a wrong output comes from, read from the
    masks: a mask left out, or per-head rows in the wrong order."""
    if key_padding_mask is None and attn_mask is None:
        return TORCH_MASKS["no_masks"]
    batch, length = valid.shape
    full = (batch, heads, length, length)
    padding = _allowed(key_padding_mask, (batch, length),
                       lambda b: b[:, None, None, :])
    per_head = isinstance(attn_mask, torch.Tensor) and attn_mask.dim() == 3
    per_query = _allowed(attn_mask, (batch * heads, length, length),
                         lambda b: b.unflatten(0, (batch, heads))) \
        if per_head else _allowed(attn_mask, (length, length), lambda b: b)
    if padding is None or per_query is None:
        return None
    given = (padding & per_query).expand(full)
    if torch.equal(given, valid[:, None, None, :].expand(full)):
        return TORCH_MASKS["causal_missing"]
    if torch.equal(given, causal.expand(full)):
        return TORCH_MASKS["padding_missing"]
    if per_head:  # rows read as (H, B): head by head
        head_major = _allowed(attn_mask, (batch * heads, length, length),
                              lambda b: b.unflatten(0, (heads, batch))
                              .transpose(0, 1))
        if torch.equal((padding & head_major).expand(full),
                       (valid[:, None, None, :] & causal).expand(full)):
            return TORCH_MASKS["per_head_order"]
    return None


def _zero_one_float(mask: object) -> bool:
    """A float mask of 0s and 1s: added to the scores, it blocks nothing."""
    return (isinstance(mask, torch.Tensor) and mask.is_floating_point()
            and bool(((mask == 0) | (mask == 1)).all()))


def check_torch_masks(
    fn: Callable[[torch.Tensor, int],
                 tuple[torch.Tensor | None, torch.Tensor | None]],
) -> Verdict:
    """Exercise 11.2: ``fn(valid_lens, length)`` returns
    ``(key_padding_mask, attn_mask)`` for ``nn.MultiheadAttention``
    (either may be None; ``attn_mask`` may be per head,
    ``(B * num_heads, L, L)``) that mean what
    ``padding_mask(valid_lens) & causal_mask(length)`` means to
    ``mha_lib``, in training (with gradients) and in eval mode."""
    generator = torch.Generator().manual_seed(111)
    m = _module(8, 4, True, seed=0).eval()
    t = to_torch_mha(m)
    for valid_lens, length in ((torch.tensor([6, 4, 3]), 6),
                               (torch.tensor([1, 5]), 5)):
        batch = len(valid_lens)
        x = torch.randn(batch, length, 8, generator=generator)
        call = attempt(fn, valid_lens.clone(), length,
                       explain=_explain_float_mask)
        if call.verdict is not None:
            return call.verdict
        if not isinstance(call.value, (tuple, list)) \
                or len(call.value) != 2:
            return Verdict(False, f"{call.label} should return a pair "
                                  f"(key_padding_mask, attn_mask)")
        key_padding_mask, attn_mask = call.value
        for name, mask in (("key_padding_mask", key_padding_mask),
                           ("attn_mask", attn_mask)):
            if mask is not None and not isinstance(mask, torch.Tensor):
                return Verdict(False, f"{call.label}: {name} should be a "
                                      f"tensor or None, got "
                                      f"{type(mask).__name__}")
        if isinstance(key_padding_mask, torch.Tensor) \
                and key_padding_mask.shape == valid_lens.shape:
            return TORCH_MASKS["lengths"].verdict(call.label)
        if any(isinstance(mask, torch.Tensor) and mask.dtype != torch.bool
               and not mask.is_floating_point()
               for mask in (key_padding_mask, attn_mask)):
            return TORCH_MASKS["int_mask"].verdict(call.label)
        if _zero_one_float(key_padding_mask) or _zero_one_float(attn_mask):
            return TORCH_MASKS["float_mask"].verdict(call.label)
        valid = padding_mask(valid_lens, length)[:, 0, 0]  # (B, Lk)
        causal = causal_mask(length)  # (L, L)

        def same(given: object, want: torch.Tensor) -> bool:
            return (isinstance(given, torch.Tensor)
                    and given.shape == want.shape
                    and torch.equal(given.bool(), want))

        for mistake, found in (
                ("swapped", same(key_padding_mask, ~causal)
                 or same(attn_mask, ~valid)),
                ("padding_polarity", same(key_padding_mask, valid)),
                ("causal_polarity", same(attn_mask, causal)),
                ("padding_shape", isinstance(key_padding_mask, torch.Tensor)
                 and key_padding_mask.shape != valid.shape),
                ("batched_attn_mask", isinstance(attn_mask, torch.Tensor)
                 and attn_mask.dim() > 2
                 and attn_mask.size(0) != batch * m.num_heads),
                ("diagonal", same(attn_mask, ~causal.tril(-1))),
                ("causal_transposed", same(attn_mask, ~causal.T))):
            if found:
                return TORCH_MASKS[mistake].verdict(call.label)
        if (isinstance(key_padding_mask, torch.Tensor)
                and isinstance(attn_mask, torch.Tensor)
                and key_padding_mask.is_floating_point()
                != attn_mask.is_floating_point()):
            return TORCH_MASKS["mixed_kinds"].verdict(call.label)
        with torch.no_grad():
            want, _ = m(x, mask=padding_mask(valid_lens, length) & causal)
        for run in _run_both_modes(t, x.clone().requires_grad_(), x, x,
                                   key_padding_mask=key_padding_mask,
                                   attn_mask=attn_mask,
                                   shown="x, x, x, your masks"):
            if run.verdict is not None:
                return Verdict(False, "nn.MultiheadAttention refused the "
                                      "masks: " + run.verdict.message)
            problem = check_tensor(
                f"the output with {call.label} "
                f"({'training' if t.training else 'eval'})",
                run.value[0], want)
            if problem is not None:
                named = _missing_mask(key_padding_mask, attn_mask, valid,
                                      causal, m.num_heads)
                return problem if named is None \
                    else named.verdict(call.label)
    if any(mask is not None and mask.is_floating_point()
           for mask in (key_padding_mask, attn_mask)):
        return Verdict(
            True, "additive float masks (-inf where blocked) work too; "
                  "the bool pair is key_padding_mask = ~valid, "
                  "attn_mask = ~causal, True = blocked")
    if attn_mask is not None and attn_mask.dim() == 3:
        return Verdict(
            True, "one attn_mask per head, (B * num_heads, L, L), works "
                  "too; the pair key_padding_mask = ~valid, attn_mask = "
                  "~causal is simpler, True = blocked")
    return Verdict(
        True,
        "key_padding_mask = ~valid, attn_mask = ~causal: True = blocked")


SDPA = catalogue(
    "check_sdpa_attention", 11,
    inverted=("the mask was inverted: F.scaled_dot_product_attention "
              "reads a bool mask as the library does, True = may attend; "
              "pass it unchanged", _FUNCTIONAL),
    float_mask=("a float mask is added to the scores: mask.float() adds 1 "
                "to the allowed scores and blocks nothing; pass the bool "
                "mask itself", _FUNCTIONAL),
    mask_ignored=("the mask is ignored: pass it as attn_mask",
                  _FUNCTIONAL),
    is_causal=("is_causal=True builds its own causal mask and cannot be "
               "combined with attn_mask: pass the given mask as attn_mask",
               _FUNCTIONAL),
    no_out_proj=("the output projection is missing: m.out_proj after "
                 "merging the heads", "The output projection", 8),
    no_biases=("the biases of q_proj, k_proj and v_proj are missing: call "
               "the layers, m.q_proj(x), or pass p.bias to F.linear",
               "Assembling the module", 8),
    no_out_bias=("out_proj's bias is missing: call m.out_proj(...), or "
                 "add m.out_proj.bias", "The output projection", 8),
    unscaled=("the scores are not scaled: scale=1.0 turns off the "
              "kernel's 1 / sqrt(D), D = head_dim, and the softmax gets "
              "scores sqrt(D) times too large: leave scale=None",
              "Why divide by $\\sqrt{d_k}$", 6),
    scaled_by_d_model=("the scores are scaled by 1 / sqrt(d_model); each "
                       "head's are scaled by 1 / sqrt(D), D = head_dim, "
                       "the kernel's default: leave scale=None",
                       "Why divide by $\\sqrt{d_k}$", 6),
    scaled_by_length=("the scores are scaled by 1 / sqrt(L), a sequence "
                      "length; the scale is 1 / sqrt(D), D = head_dim, the "
                      "kernel's default: leave scale=None",
                      "Why divide by $\\sqrt{d_k}$", 6),
    no_transpose=("the heads were merged without moving the head axis "
                  "back: merge_heads (or transpose(1, 2) before the "
                  "reshape)", "The way back: `merge_heads`", 5),
    one_head=("the heads were never split: the kernel on (B, L, d_model) "
              "is attention with one head of width d_model; split_heads "
              "before the kernel, merge_heads after",
              "Which features belong to which head", 5),
    view_split=("the heads were split with a view (B, H, L, D) alone: "
                "that cuts the sequence, not the features, into heads; "
                "split_heads (view (B, L, H, D), then transpose(1, 2))",
                "The wrong way: `view` straight to `(B, H, L, D)`", 5),
    nan_row=("the query with nothing to attend to gets NaN; mha_lib "
             "gives it zero weights (your PyTorch's kernel does not): "
             "zero those rows", "Where PyTorch differs: a query with "
                                "nothing to attend to"),
    no_sdpa=("the exercise computes the attention with "
             "F.scaled_dot_product_attention from m's layers, without "
             "calling m itself", _FUNCTIONAL),
    dropout=("dropout_p is not 0, but m has no dropout (m.dropout is "
             "0.0), and the kernel has no eval mode: pass dropout_p="
             "m.dropout if m.training else 0.0", _FUNCTIONAL),
    dropout_in_eval=("dropout_p is not 0 for a module in eval mode: the "
                     "kernel has no eval mode and drops weights whenever "
                     "dropout_p > 0; pass dropout_p=m.dropout if "
                     "m.training else 0.0", _FUNCTIONAL),
    finite_fill=("a query with no key to attend gets the average of all "
                 "values: a finite fill (-1e9, say) for the blocked "
                 "scores leaves that row's scores all equal, so the "
                 "softmax spreads it uniformly; zero those rows, as m "
                 "does", "Where PyTorch differs: a query with "
                         "nothing to attend to"),
    not_zeroed=("a query with no key to attend keeps what the kernel "
                "returns on its row: zeros on the CPU, but finite "
                "non-zero values from cuDNN's kernel (the default in "
                "fp16 and bf16 on an H200) and from this check's; zero "
                "those rows yourself, as m does", "Where PyTorch "
                "differs: a query with nothing to attend to"),
    no_gradient=("the gradients of m's weights differ from the module's: "
                 "no .detach(), .data or torch.no_grad() on the way",
                 _FUNCTIONAL),
)


def _explain_sdpa(error: BaseException | None, record) -> object:
    for _, _, kwargs in record.find(F.scaled_dot_product_attention):
        if kwargs.get("is_causal"):
            return SDPA["is_causal"]
    return None


def _dropout_p(record) -> float:
    """The largest ``dropout_p`` passed to the kernel."""
    return max((float(kwargs.get("dropout_p",
                                 args[4] if len(args) > 4 else 0.0))
                for _, args, kwargs in record.find(
                    F.scaled_dot_product_attention)), default=0.0)


def _wrong_sdpa(m: MultiHeadAttention, x: torch.Tensor,
                mask: torch.Tensor | None, how: str) -> torch.Tensor:
    """The output of a usual wrong answer."""
    def project(p: nn.Linear) -> torch.Tensor:  # (B, L, d_model)
        no_bias = how in ("no_biases", "no_biases_at_all")
        return F.linear(x, p.weight, None if no_bias else p.bias)

    scale = {"unscaled": 1.0, "scaled_by_d_model": x.size(-1) ** -0.5,
             "scaled_by_length": x.size(1) ** -0.5}.get(how)
    with torch.no_grad():
        q, k, v = (split_heads(project(p), m.num_heads)
                   for p in (m.q_proj, m.k_proj, m.v_proj))  # (B, H, L, D)
        if how == "one_head":  # (B, L, d_model): never split, wrong
            q, k, v = (project(p) for p in (m.q_proj, m.k_proj, m.v_proj))
        if how.startswith("view_split"):  # (B, H, L, D) by a view, wrong
            q, k, v = (p(x).view(x.size(0), m.num_heads, x.size(1), -1)
                       for p in (m.q_proj, m.k_proj, m.v_proj))
        if how == "inverted":
            mask = ~mask
        elif how == "float_mask":
            mask = mask.float()
        elif how == "mask_ignored":
            mask = None
        elif how == "finite_fill":  # -1e9 where blocked: uniform rows
            mask = torch.zeros(mask.shape).masked_fill(~mask, -1e9)
        heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                               scale=scale)
        if how in ("no_transpose", "view_split", "one_head"):
            merged = heads.reshape(x.shape)  # (B, L, d_model), wrong
        else:
            merged = heads.transpose(1, 2).reshape(x.shape)  # (B, L, d)
        if how == "no_out_proj":
            return merged
        if how in ("no_out_bias", "no_biases_at_all"):
            return F.linear(merged, m.out_proj.weight)
        return m.out_proj(merged)


_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p",
              "is_causal", "scale", "enable_gqa")


class _NonZeroEmptyRows(TorchFunctionMode):
    """``F.scaled_dot_product_attention`` as cuDNN's kernel behaves (on
    an H200, torch 2.11, fp16 and bf16): on a query whose every key is
    masked it returns finite non-zero values, here that query's output
    without the mask; every other row, and every other function, as
    PyTorch computes it."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is not F.scaled_dot_product_attention:
            return out
        bound = dict(zip(_SDPA_ARGS, args, strict=False)) | kwargs
        mask = bound.get("attn_mask")
        if not isinstance(mask, torch.Tensor):
            return out
        empty = (~mask.any(dim=-1, keepdim=True) if mask.dtype == torch.bool
                 else mask.isneginf().all(dim=-1, keepdim=True))
        if not empty.any():
            return out
        unmasked = func(**(bound | {"attn_mask": None}))
        return torch.where(empty, unmasked, out)  # (B, H, L, D)


def check_sdpa_attention(
    fn: Callable[[MultiHeadAttention, torch.Tensor, torch.Tensor | None],
                 torch.Tensor],
) -> Verdict:
    """Exercise 11.3: ``fn(m, x, mask)`` computes ``m(x, mask=mask)[0]``
    with ``m``'s layers and
    ``torch.nn.functional.scaled_dot_product_attention`` for the
    attention, gradients and a query with nothing to attend to
    included: that query's row is checked again with a kernel that
    returns finite non-zero values there, as cuDNN's does."""
    generator = torch.Generator().manual_seed(1111)
    for d_model, num_heads in ((8, 4), (12, 3)):
        m = _module(d_model, num_heads, True, seed=d_model).train()
        x = torch.randn(3, 6, d_model, generator=generator)
        masks = {
            "no mask": None,
            "causal": causal_mask(6),
            "padding & causal": (padding_mask(torch.tensor([6, 4, 3]), 6)
                                 & causal_mask(6)),
            "a sentence of length 0": (padding_mask(
                torch.tensor([6, 0, 3]), 6) & causal_mask(6)),
        }
        for name, mask in masks.items():
            with calls_to(m) as called:  # the module itself called
                call = attempt(fn, m, x, mask, shown=f"m, x, {name}",
                               explain=_explain_sdpa)
            if call.verdict is not None:
                return call.verdict
            if called or not call.record.used(
                    F.scaled_dot_product_attention):
                return SDPA["no_sdpa"].verdict(call.label)
            if _explain_sdpa(None, call.record) is not None:
                return SDPA["is_causal"].verdict(call.label)
            if _dropout_p(call.record) > m.dropout:
                return SDPA["dropout"].verdict(call.label)
            want, _ = m(x, mask=mask)
            given = call.value
            if isinstance(given, torch.Tensor) and mask is not None \
                    and given.shape == want.shape \
                    and given.isnan().any() and not want.isnan().any():
                return SDPA["nan_row"].verdict(call.label)
            wrong = [(SDPA["no_out_proj"], "no_out_proj"),
                     (SDPA["no_biases"], "no_biases"),
                     (SDPA["no_biases"], "no_biases_at_all"),
                     (SDPA["no_out_bias"], "no_out_bias"),
                     (SDPA["unscaled"], "unscaled"),
                     (SDPA["scaled_by_d_model"], "scaled_by_d_model"),
                     (SDPA["scaled_by_length"], "scaled_by_length"),
                     (SDPA["no_transpose"], "no_transpose"),
                     (SDPA["view_split"], "view_split"),
                     (SDPA["view_split"], "view_split_merge_heads")]
            if mask is None:  # a (B, 1, L, L) mask would not fit
                wrong.append((SDPA["one_head"], "one_head"))
            if mask is not None:
                wrong += [(SDPA[how], how) for how in
                          ("inverted", "float_mask", "mask_ignored",
                           "finite_fill")]
            problem = check_tensor(
                f"{call.label} (d_model={d_model}, num_heads={num_heads})",
                given, want.detach(), axes="(B, L, d_model)",
                mistakes=[(mistake, partial(_wrong_sdpa, m, x, mask, how))
                          for mistake, how in wrong])
            if problem is not None:
                return problem
            if not given.requires_grad:
                return SDPA["no_gradient"].verdict(call.label)
            params = list(m.parameters())
            got = torch.autograd.grad(given.sum(), params,
                                      allow_unused=True)
            grads = torch.autograd.grad(want.sum(), params)
            if any(g is None or not torch.allclose(g, w, atol=1e-4)
                   for g, w in zip(got, grads, strict=True)):
                return SDPA["no_gradient"].verdict(call.label)
            if name == "a sentence of length 0":  # checked again below
                empty_case = (m, x, mask, want.detach())
    with torch.random.fork_rng():  # a module with dropout, in eval mode
        torch.manual_seed(8)
        m = MultiHeadAttention(8, 4, dropout=0.5).eval()
    x = torch.randn(3, 6, 8, generator=generator)
    call = attempt(fn, m, x, causal_mask(6),
                   shown="m (dropout 0.5, eval mode), x, causal",
                   explain=_explain_sdpa)
    if call.verdict is not None:
        return call.verdict
    if _dropout_p(call.record) > 0:
        return SDPA["dropout_in_eval"].verdict(call.label)
    problem = check_tensor(
        f"{call.label} (dropout 0.5, eval mode)", call.value,
        m(x, mask=causal_mask(6))[0].detach(), axes="(B, L, d_model)")
    if problem is not None:
        return problem
    m, x, mask, want = empty_case
    with _NonZeroEmptyRows():  # a kernel that does not zero such rows
        call = attempt(fn, m, x, mask, shown="m, x, a sentence of length 0",
                       explain=_explain_sdpa)
    if call.verdict is not None:
        return call.verdict
    if not torch.allclose(call.value, want, atol=1e-5):
        return SDPA["not_zeroed"].verdict(
            f"{call.label}, with a kernel that does not zero such rows")
    return Verdict(
        True, "the fused kernel takes the library's bool mask as it is")
