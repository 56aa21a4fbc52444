"""Checkers for chapter 13's exercises (cost and speed)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils.flop_counter import FlopCounterMode

from mha_lib.attention import masked_softmax, scaled_dot_product_attention
from mha_lib.exercises.verdict import Verdict, close
from mha_lib.mha import MultiHeadAttention

__all__ = ["check_score_flops", "check_weights_mib", "check_tiled_softmax",
           "check_masked_tiles"]

# (batch, length, d_model, num_heads): the running example, a base
# transformer layer, a long context with many heads, a single head.
_CONFIGS = ((3, 6, 8, 4), (1, 1024, 512, 8), (8, 4096, 4096, 32),
            (2, 100, 64, 1))


def _score_flops(batch: int, length: int, d_model: int,
                 num_heads: int) -> int:
    """FLOPs of ``Q K^T`` as PyTorch's own counter sees them (shapes only,
    no data)."""
    head_dim = d_model // num_heads
    q = torch.empty(batch, num_heads, length, head_dim,
                    device="meta")  # (B, H, L, D)
    with FlopCounterMode(display=False) as counter:
        q @ q.transpose(-2, -1)  # (B, H, L, L)
    return counter.get_total_flops()


def check_score_flops(fn: Callable[[int, int, int, int], int]) -> Verdict:
    """Exercise 13.1: ``fn(batch, length, d_model, num_heads)`` returns the
    FLOPs of the score matrix ``Q K^T`` of self-attention (a multiply-add
    counts as 2 FLOPs)."""
    for batch, length, d_model, num_heads in _CONFIGS:
        args = f"fn({batch}, {length}, {d_model}, {num_heads})"
        try:
            given = fn(batch, length, d_model, num_heads)
        except Exception as error:
            # the reader's code: report it, do not crash the notebook
            return Verdict(
                False, f"{args} raised {type(error).__name__}: {error}")
        expected = _score_flops(batch, length, d_model, num_heads)
        if given == expected:
            continue
        hint = ""
        if given == expected // 2:
            hint = ": a multiply-add is 2 FLOPs"
        elif given == 2 * expected:
            hint = ": count Q K^T only, not weights @ V as well"
        elif (given in (expected * num_heads, expected // num_heads)
              and num_heads > 1):
            hint = (": each of the H heads has head_dim = d_model / H, "
                    "so H * L * L * head_dim")
        return Verdict(
            False, f"{args} should be {expected:,}, got {given!r}{hint}")
    return Verdict(
        True, "Q K^T costs 2 * B * L^2 * d_model FLOPs: quadratic in L, "
              "independent of the number of heads")


def _weights_mib(batch: int, length: int, num_heads: int,
                 dtype: torch.dtype) -> float:
    weights = torch.empty(batch, num_heads, length, length, dtype=dtype,
                          device="meta")
    return weights.nelement() * weights.element_size() / 2**20


def check_weights_mib(
    fn: Callable[[int, int, int, torch.dtype], float],
) -> Verdict:
    """Exercise 13.2: ``fn(batch, length, num_heads, dtype)`` returns the
    size in MiB (2**20 bytes) of the attention weights ``(B, H, L, L)`` of
    self-attention."""
    # First a real tensor: the weights MultiHeadAttention returns for the
    # running example.
    with torch.random.fork_rng():  # leave the reader's random state alone
        torch.manual_seed(12)
        module = MultiHeadAttention(8, 4).eval()
        with torch.no_grad():
            _, weights = module(torch.randn(3, 6, 8))
    real = weights.nelement() * weights.element_size() / 2**20
    cases = [((3, 6, 4, torch.float32), real)]
    for batch, length, num_heads in ((1, 4096, 8), (8, 2048, 16),
                                     (2, 100, 1)):
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            cases.append(((batch, length, num_heads, dtype),
                          _weights_mib(batch, length, num_heads, dtype)))
    for (batch, length, num_heads, dtype), expected in cases:
        args = f"fn({batch}, {length}, {num_heads}, {dtype})"
        try:
            given = fn(batch, length, num_heads, dtype)
        except Exception as error:
            # the reader's code: report it, do not crash the notebook
            return Verdict(
                False, f"{args} raised {type(error).__name__}: {error}")
        if not isinstance(given, (int, float)) or isinstance(given, bool):
            return Verdict(
                False, f"{args} should return a number, "
                       f"got {type(given).__name__}")
        if abs(given - expected) <= 1e-9 * expected:
            continue
        hint = ""
        if abs(given - expected * 2**20 / 10**6) <= 1e-6 * expected:
            hint = ": a MiB is 2**20 bytes, not 10**6"
        elif abs(given - expected * 2**20) <= 1e-6 * expected * 2**20:
            hint = ": that is bytes; divide by 2**20 for MiB"
        elif (dtype != torch.float32
              and abs(given - 2 * expected) <= 1e-6 * expected):
            hint = (f": an element of {dtype} takes "
                    f"{torch.finfo(dtype).bits // 8} bytes")
        return Verdict(
            False,
            f"{args} should be {expected:.6g} MiB, got {given!r}{hint}")
    return Verdict(
        True, "B * H * L^2 * bytes per element: 1 x 8 heads x 4096^2 in "
              "float32 is 512 MiB, for one layer's weights alone")


def _per_block_softmax(scores: torch.Tensor,
                       block_size: int) -> torch.Tensor:
    """The usual mistake: each block normalised on its own."""
    return torch.cat([torch.softmax(block, dim=-1)
                      for block in scores.split(block_size, dim=-1)],
                     dim=-1)


# Operations that read a whole row of scores at once when their input is
# wider than a block: a tiled softmax never applies them to more than
# block_size scores.
_WHOLE_ROW = {
    torch.softmax, torch.Tensor.softmax, torch.nn.functional.softmax,
    torch.log_softmax, torch.Tensor.log_softmax, torch.exp,
    torch.Tensor.exp, torch.max, torch.Tensor.max, torch.amax,
    torch.Tensor.amax, torch.sum, torch.Tensor.sum, torch.logsumexp,
    torch.Tensor.logsumexp,
}


class _BlockWatch(TorchFunctionMode):
    """Records the first whole-row operation on more than ``width``
    scores."""

    def __init__(self, width: int):
        super().__init__()
        self.width = width
        self.seen: str | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        first = args[0] if args else None
        if (self.seen is None and func in _WHOLE_ROW
                and isinstance(first, torch.Tensor) and first.dim()
                and first.size(-1) > self.width):
            self.seen = (f"{getattr(func, '__name__', func)} on "
                         f"{first.size(-1)} scores")
        return func(*args, **kwargs)


def _call(fn: Callable, args: tuple, label: str, width: int
          ) -> tuple[object, Verdict | None]:
    """``fn(*args)`` under a watch for whole-row operations."""
    watch = _BlockWatch(width)
    try:
        with watch:
            given = fn(*args)
    except Exception as error:
        # the reader's code: report it, do not crash the notebook
        return None, Verdict(
            False, f"{label} raised {type(error).__name__}: {error}")
    if watch.seen is not None:
        return None, Verdict(
            False, f"{label} called {watch.seen} at once: read the scores "
                   f"in blocks of at most block_size={width}")
    return given, None


def check_tiled_softmax(
    fn: Callable[[torch.Tensor, int], torch.Tensor],
) -> Verdict:
    """Exercise 13.3: ``fn(scores, block_size)`` returns
    ``softmax(scores, dim=-1)``, reading the last dim in blocks of
    ``block_size`` with a running max and sum (a plain ``torch.softmax``
    over the whole row is refused)."""
    generator = torch.Generator().manual_seed(1212)
    cases = [
        ("random (2, 3, 5, 7)",
         torch.randn(2, 3, 5, 7, generator=generator), (1, 3, 7, 10)),
        ("scores near 1000 (exp overflows without the max)",
         1000 + torch.randn(4, 9, generator=generator), (2, 4)),
        ("the largest score in the last block",
         torch.linspace(-5.0, 20.0, 12).expand(3, 12), (5,)),
    ]
    for name, scores, block_sizes in cases:
        expected = masked_softmax(scores)
        for block_size in block_sizes:
            args = f"fn({name}, block_size={block_size})"
            given, refused = _call(fn, (scores.clone(), block_size), args,
                                   block_size)
            if refused is not None:
                return refused
            verdict = close(args, given, expected, "")
            if verdict:
                continue
            if (isinstance(given, torch.Tensor)
                    and not torch.isfinite(given).all()):
                return Verdict(
                    False, f"{args} has inf or NaN: subtract the running "
                           "max before exp")
            if (isinstance(given, torch.Tensor)
                    and given.shape == expected.shape
                    and torch.allclose(
                        given, _per_block_softmax(scores, block_size),
                        atol=1e-6)):
                return Verdict(
                    False, f"{args} normalises each block on its own: "
                           "divide by the sum over all blocks, rescaled "
                           "when the max changes")
            return verdict
    return Verdict(
        True, "a running max and sum, then the weights, block by block")


def check_masked_tiles(
    fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                  int], torch.Tensor],
) -> Verdict:
    """Exercise 13.4: ``fn(query, key, value, mask, block_size)`` is tiled
    attention with a bool ``mask`` ``(Lq, Lk)`` (True = may attend): the
    output of ``mha_lib.scaled_dot_product_attention``, zeros for a query
    that may attend nothing, and no NaN from a tile whose keys are all
    masked."""
    generator = torch.Generator().manual_seed(1313)
    q, k, v = torch.randn(3, 2, 3, 10, 4, generator=generator).unbind(0)
    causal = torch.ones(10, 10, dtype=torch.bool).tril()
    padded = torch.ones(10, 10, dtype=torch.bool)
    padded[:, 3:] = False  # keys 3.. are padding: whole tiles masked
    left = torch.ones(10, 10, dtype=torch.bool)
    left[:, :5] = False  # left padding: the first tiles are all masked
    empty = causal.clone()
    empty[4] = False  # query 4 may attend nothing
    cases = [("causal", causal), ("keys 3-9 padded", padded),
             ("keys 0-4 padded", left), ("query 4 fully masked", empty)]
    for name, mask in cases:
        expected, _ = scaled_dot_product_attention(q, k, v, mask)
        for block_size in (2, 3, 4):
            args = f"fn(q, k, v, {name} mask, block_size={block_size})"
            given, refused = _call(fn, (q, k, v, mask, block_size), args,
                                   block_size)
            if refused is not None:
                return refused
            if (isinstance(given, torch.Tensor)
                    and given.shape == expected.shape
                    and torch.isnan(given).any()):
                return Verdict(
                    False, f"{args} has NaN: in a tile whose keys are all "
                           "masked the running max stays -inf, and "
                           "exp(-inf - (-inf)) is NaN; subtract 0 where "
                           "the max is still -inf")
            verdict = close(args, given, expected, "")
            if not verdict:
                return verdict
    return Verdict(True, "masked tiles add nothing, and no row turns NaN")
