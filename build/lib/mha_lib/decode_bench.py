"""Greedy decoding of a random TinyTransformer, with and without the
key/value cache: median times, speed-up, and whether both decode the same
tokens (chapter 14).

Defaults: batch 1, a 16-token prompt, 256 new tokens, 4 layers, d_model
256, 8 heads.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import torch

from mha_lib.model import TinyTransformer, decode_speed

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> dict[str, float | bool]:
    parser = argparse.ArgumentParser(
        prog="python -m mha_lib.decode_bench", description=__doc__)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=None,
                        help="default: = heads (MHA)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--new", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = TinyTransformer(args.vocab, args.d_model, args.heads,
                            args.layers, max_len=args.prompt + args.new,
                            num_kv_heads=args.kv_heads)
    prompt = torch.randint(args.vocab, (1, args.prompt))
    result = decode_speed(model, prompt, args.new, args.rounds)
    print(f"{args.layers} layers, d_model {args.d_model}, "
          f"{args.heads} heads, kv heads {args.kv_heads or args.heads}, "
          f"batch 1, prompt {args.prompt}, {args.new} new tokens, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"cached {result['cached_ms']:.1f} ms, "
          f"uncached {result['uncached_ms']:.1f} ms, "
          f"speed-up {result['speedup']:.1f}x, "
          f"same tokens: {result['same_tokens']}")
    return result


if __name__ == "__main__":
    main()
