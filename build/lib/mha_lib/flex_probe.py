"""What compiled FlexAttention does on your machine (chapter 17 quotes it).

Run it (a minute or two, most of it compiling)::

    python -m mha_lib.flex_probe
    python -m mha_lib.flex_probe --device cuda --length 4096 --dtype float16

For each case (no mask; causal, sliding-window and padding block masks;
ALiBi as a score_mod with a causal block mask) it compiles
``flex_attention`` with ``torch.compile`` (a fresh compile per case,
dynamic=False), reports whether that worked, how long the first call took
(the compile), the largest difference from SDPA with the dense mask or
bias, and the median time of a call: eager FlexAttention, compiled, SDPA
given the dense mask, and for the causal case SDPA's own
``is_causal=True`` (no mask tensor: the fastest way to ask for causal
attention); B=1, H=8, D=64, by default L=1024 in float32 on the CPU.
"""

from __future__ import annotations

import argparse
import statistics
import time
import traceback
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import (
    create_block_mask,
    flex_attention,
)

from mha_lib.alibi import alibi_bias, alibi_slopes
from mha_lib.bench import _sync, _timed
from mha_lib.masks import padding_mask, sliding_window_mask

warnings.filterwarnings("ignore", message=".*flex_attention.*")
B, H, D, W = 1, 8, 64, 256


def median_ms(fn, rounds: int = 5, device: str = "cpu") -> float:
    """Median wall time of ``fn()`` in ms, after one warm-up call (on a GPU,
    each call waited for)."""
    fn()
    return statistics.median(_timed(fn, device) for _ in range(rounds))


def main(argv: list[str] | None = None) -> None:
    """Print one row per case (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m mha_lib.flex_probe",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--dtype", default="float32",
                        choices=["float32", "float16", "bfloat16"])
    args = parser.parse_args(argv)
    device, L, dtype = args.device, args.length, getattr(torch, args.dtype)
    torch.manual_seed(0)
    where = (torch.cuda.get_device_name(device) if device.startswith("cuda")
             else f"CPU, {torch.get_num_threads()} threads")
    print(f"torch {torch.__version__}, {where}, "
          f"B={B} H={H} L={L} D={D} {args.dtype}, window {W}")
    q, k, v = (torch.randn(B, H, L, D, device=device, dtype=dtype)
               for _ in range(3))
    lens = torch.tensor([L - 100], device=device)
    slopes = torch.tensor(alibi_slopes(H), device=device)
    causal_dense = torch.ones(L, L, dtype=torch.bool, device=device).tril()

    def causal(b, h, i, j):
        return i >= j

    def window(b, h, i, j):
        return (i >= j) & (i - j < W)

    def padding(b, h, i, j):
        return j < lens[b]

    def alibi(score, b, h, i, j):
        return score + slopes[h] * (j - i)

    alibi_dense = alibi_bias(H, L, device=device).masked_fill(
        ~causal_dense, float("-inf")).to(dtype)
    cases = [
        ("no mask", None, None, None),
        ("causal", causal, None, causal_dense),
        ("sliding window", window, None,
         sliding_window_mask(L, W, device=device)),
        ("padding", padding, None, padding_mask(lens, L)),
        ("ALiBi + causal", causal, alibi, alibi_dense),
    ]
    print(f"{'case':16} {'compiles':8} {'1st call s':>10} "
          f"{'max diff':>9} {'eager ms':>9} {'compiled':>9} {'SDPA ms':>8} "
          f"{'is_causal':>9}")
    for name, mask_mod, score_mod, dense in cases:
        block = (None if mask_mod is None else create_block_mask(
            mask_mod, None, None, L, L, device=device))
        reference = F.scaled_dot_product_attention(q, k, v, dense)
        torch.compiler.reset()  # a fresh compile per case
        compiled = torch.compile(flex_attention, dynamic=False)
        start = time.perf_counter()
        try:
            out = compiled(q, k, v, score_mod=score_mod, block_mask=block)
            _sync(device)
            ok, first = "yes", time.perf_counter() - start
            diff = (out - reference).abs().max().item()
            compiled_ms = median_ms(lambda: compiled(  # noqa: B023
                q, k, v, score_mod=score_mod, block_mask=block),  # noqa: B023
                device=device)
        except Exception as error:  # noqa: BLE001 - report it, go on
            ok, first = "NO", time.perf_counter() - start
            diff = compiled_ms = float("nan")
            print(f"  {name}: {type(error).__name__}: {str(error)[:300]}")
            traceback.print_exc(limit=1)
        eager_ms = median_ms(lambda: flex_attention(  # noqa: B023
            q, k, v, score_mod=score_mod, block_mask=block),  # noqa: B023
            rounds=3, device=device)
        sdpa_ms = median_ms(lambda: F.scaled_dot_product_attention(  # noqa: B023
            q, k, v, dense), device=device)  # noqa: B023
        causal_ms = (median_ms(lambda: F.scaled_dot_product_attention(
            q, k, v, is_causal=True), device=device)
            if name == "causal" else float("nan"))
        print(f"{name:16} {ok:8} {first:10.1f} {diff:9.1e} {eager_ms:9.1f} "
              f"{compiled_ms:9.1f} {sdpa_ms:8.1f} {causal_ms:9.1f}")


if __name__ == "__main__":
    main()
