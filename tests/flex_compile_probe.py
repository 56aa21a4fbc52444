"""What compiled FlexAttention does on this machine's CPU (chapter 17 quotes it).

Run from the repository root (takes a minute or two, most of it compiling)::

    .venv/bin/python tests/flex_compile_probe.py

For each case (no mask; causal, sliding-window and padding block masks; ALiBi as a
score_mod with a causal block mask) it compiles ``flex_attention`` with ``torch.compile``
(a fresh compile per case, dynamic=False), reports whether that worked, how long the first
call took (the compile), the largest difference from SDPA with the dense mask or bias, and
the median time of a call, eager FlexAttention vs compiled vs SDPA, for B=1, H=8, L=1024,
D=64 in float32.
"""

from __future__ import annotations

import statistics
import sys
import time
import traceback
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mha_lib import alibi_bias, padding_mask, sliding_window_mask  # noqa: E402
from mha_lib.alibi import alibi_slopes  # noqa: E402

warnings.filterwarnings("ignore", message=".*flex_attention.*")
B, H, L, D, W = 1, 8, 1024, 64, 256


def median_ms(fn, rounds=5):
    fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"B={B} H={H} L={L} D={D} float32, window {W}")
    q, k, v = (torch.randn(B, H, L, D) for _ in range(3))
    lens = torch.tensor([L - 100])
    slopes = torch.tensor(alibi_slopes(H))
    causal_dense = torch.ones(L, L, dtype=torch.bool).tril()

    def causal(b, h, i, j):
        return i >= j

    def window(b, h, i, j):
        return (i >= j) & (i - j < W)

    def padding(b, h, i, j):
        return j < lens[b]

    def alibi(score, b, h, i, j):
        return score + slopes[h] * (j - i)

    alibi_dense = alibi_bias(H, L).masked_fill(~causal_dense, float("-inf"))
    cases = [
        ("no mask", None, None, None),
        ("causal", causal, None, causal_dense),
        ("sliding window", window, None, sliding_window_mask(L, W)),
        ("padding", padding, None, padding_mask(lens, L)),
        ("ALiBi + causal", causal, alibi, alibi_dense),
    ]
    print(f"{'case':16} {'compiles':8} {'1st call s':>10} {'max diff':>9} "
          f"{'eager ms':>9} {'compiled':>9} {'SDPA ms':>8}")
    for name, mask_mod, score_mod, dense in cases:
        block = (None if mask_mod is None else
                 create_block_mask(mask_mod, None, None, L, L, device="cpu"))
        reference = F.scaled_dot_product_attention(q, k, v, dense)
        torch._dynamo.reset()  # noqa: SLF001 - a fresh compile per case
        compiled = torch.compile(flex_attention, dynamic=False)
        start = time.perf_counter()
        try:
            out = compiled(q, k, v, score_mod=score_mod, block_mask=block)
            ok, first = "yes", time.perf_counter() - start
            diff = (out - reference).abs().max().item()
            compiled_ms = median_ms(lambda: compiled(  # noqa: B023
                q, k, v, score_mod=score_mod, block_mask=block))  # noqa: B023
        except Exception as error:  # noqa: BLE001 - report it, go on
            ok, first, diff, compiled_ms = "NO", time.perf_counter() - start, \
                float("nan"), float("nan")
            print(f"  {name}: {type(error).__name__}: {str(error)[:300]}")
            traceback.print_exc(limit=1)
        eager_ms = median_ms(lambda: flex_attention(  # noqa: B023
            q, k, v, score_mod=score_mod, block_mask=block), rounds=3)  # noqa: B023
        sdpa_ms = median_ms(lambda: F.scaled_dot_product_attention(  # noqa: B023
            q, k, v, dense))  # noqa: B023
        print(f"{name:16} {ok:8} {first:10.1f} {diff:9.1e} {eager_ms:9.1f} "
              f"{compiled_ms:9.1f} {sdpa_ms:8.1f}")


if __name__ == "__main__":
    main()
