"""Time and memory of the attention implementations, side by side (chapter 13).

Run ``python -m mha_lib.bench --help``. For every sequence length it measures, in one
process and interleaved (round-robin, so that a slower moment of the machine hits every
implementation alike):

* ``explicit``: ``MultiHeadAttention(need_weights=True)``, the path the book derives;
* ``fused``: ``MultiHeadAttention(need_weights=False)`` on
  ``F.scaled_dot_product_attention``, its projections on oneDNN (``mha_lib.linear``);
* ``torch``: ``nn.MultiheadAttention(batch_first=True)`` with the same weights,
  ``need_weights=False``, the reference;
* ``compiled`` (``--compile``): ``torch.compile`` of the fused path.

Each is timed in two modes, ``fwd`` (eval, no grad) and ``train`` (forward + backward);
a table of median milliseconds and ratios to ``torch`` is printed and a plot saved.
Peak memory of forward + backward is measured once per length, on CUDA with the
allocator's peak counter, on CPU from the profiler's allocation events.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from mha_lib.interop import to_torch_mha
from mha_lib.mha import MultiHeadAttention

__all__ = ["Result", "benchmark", "peak_memory", "main"]

MODES = ("fwd", "train")


@dataclass
class Result:
    """Median times (ms) per (implementation, mode, length) and peak memory (MiB)."""

    lengths: list[int]
    times: dict[tuple[str, str, int], float] = field(default_factory=dict)
    memory: dict[tuple[str, int], float] = field(default_factory=dict)

    def ratio(self, impl: str, mode: str, length: int, reference: str = "torch") -> float:
        return self.times[impl, mode, length] / self.times[reference, mode, length]


def _implementations(d_model: int, num_heads: int, device: str, dtype: torch.dtype,
                     compile_: bool
                     ) -> tuple[dict[str, Callable[[torch.Tensor], torch.Tensor]], list[nn.Module]]:
    ours = MultiHeadAttention(d_model, num_heads).to(device=device, dtype=dtype)
    reference = to_torch_mha(ours)
    impls = {
        "explicit": lambda x: ours(x, need_weights=True)[0],
        "fused": lambda x: ours(x, need_weights=False)[0],
        "torch": lambda x: reference(x, x, x, need_weights=False)[0],
    }
    if compile_:
        compiled = torch.compile(lambda x: ours(x, need_weights=False)[0])
        impls["compiled"] = compiled
    return impls, [ours, reference]


def _step(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, mode: str) -> None:
    if mode == "fwd":
        with torch.no_grad():
            fn(x)
    else:
        fn(x).sum().backward()


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@contextlib.contextmanager
def _quiet_stderr():
    """Silence file descriptor 2: the CPU profiler writes log lines straight to it,
    past Python's sys.stderr (and so into notebook outputs)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def peak_memory(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> float:
    """Peak memory (MiB) allocated during one forward + backward of ``fn(x)``, beyond
    what was allocated before it."""
    if x.device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn(x).sum().backward()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2**20
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn(x).sum().backward()
    # Every event's own allocations (+) and frees (-), in time order: the running sum
    # is the memory held at each moment, and its maximum the peak.
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    current = peak = 0
    for event in events:
        current += event.self_cpu_memory_usage
        peak = max(peak, current)
    return peak / 2**20


def benchmark(lengths: Sequence[int], batch: int = 8, d_model: int = 512, num_heads: int = 8,
              dtype: torch.dtype = torch.float32, device: str = "cpu", rounds: int = 7,
              repeat: int = 1, warmup: int = 2, modes: Sequence[str] = MODES,
              compile_: bool = False, memory: bool = True, progress: bool = True) -> Result:
    """Interleaved timing of every implementation at every length; medians of ``rounds``.

    ``rounds=0`` skips the timing (memory only)."""
    torch.manual_seed(0)
    impls, modules = _implementations(d_model, num_heads, device, dtype, compile_)
    names = list(impls)
    result = Result(list(lengths))
    if rounds == 0:
        modes, warmup = (), 0
    total = max(1, len(lengths) * len(modes) * (warmup + rounds))
    done = 0
    for length in lengths:
        x = torch.randn(batch, length, d_model, device=device, dtype=dtype)
        for mode in modes:
            for module in modules:  # eval for "fwd": nn.MultiheadAttention's fast path
                module.train(mode == "train")
            xm = x.requires_grad_(mode == "train")
            samples: dict[str, list[float]] = {name: [] for name in names}
            for r in range(warmup + rounds):
                order = names[r % len(names):] + names[: r % len(names)]  # rotate the order
                for name in order:
                    _sync(device)
                    start = time.perf_counter()
                    for _ in range(repeat):
                        _step(impls[name], xm, mode)
                    _sync(device)
                    if r >= warmup:
                        samples[name].append((time.perf_counter() - start) * 1e3 / repeat)
                done += 1
                if progress:
                    _progress(done, total, f"L={length} {mode}")
            for name in names:
                result.times[name, mode, length] = statistics.median(samples[name])
        if memory:
            for module in modules:
                module.train()
            for name in names:
                xg = x.detach().requires_grad_(True)
                result.memory[name, length] = peak_memory(impls[name], xg)
    if progress:
        print(file=sys.stderr)
    return result


def _progress(done: int, total: int, label: str, width: int = 30) -> None:
    filled = width * done // total
    print(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {label:<16}",
          end="", file=sys.stderr, flush=True)


def format_table(result: Result) -> str:
    names = sorted({key[0] for key in [*result.times, *result.memory]}, key=_order)
    modes = [m for m in MODES if any(k[1] == m for k in result.times)]
    lines: list[str] = []
    header = f"{'L':>6} {'mode':>5} " + " ".join(f"{n + ' ms':>13}" for n in names) + " " + \
        " ".join(f"{n + '/torch':>15}" for n in names if n != "torch")
    if result.times:
        lines.append(header)
    for length in result.lengths if result.times else []:
        for mode in modes:
            row = f"{length:>6} {mode:>5} "
            row += " ".join(f"{result.times[n, mode, length]:>13.2f}" for n in names) + " "
            row += " ".join(f"{result.ratio(n, mode, length):>15.3f}"
                            for n in names if n != "torch")
            lines.append(row)
    if result.memory:
        if lines:
            lines.append("")
        lines.append(f"{'L':>6} " + " ".join(f"{n + ' MiB':>13}" for n in names) +
                     f" {'fused/explicit':>15}")
        for length in result.lengths:
            row = f"{length:>6} " + " ".join(f"{result.memory[n, length]:>13.1f}" for n in names)
            row += f" {result.memory['fused', length] / result.memory['explicit', length]:>15.3f}"
            lines.append(row)
    return "\n".join(lines)


def _order(name: str) -> int:
    return ["explicit", "fused", "compiled", "torch"].index(name)


def plot(result: Result, path: str) -> None:
    from matplotlib.figure import Figure  # no pyplot: no window, no change of backend

    names = sorted({key[0] for key in [*result.times, *result.memory]}, key=_order)
    modes = [m for m in MODES if any(k[1] == m for k in result.times)]
    panels = len(modes) + bool(result.memory)
    fig = Figure(figsize=(5 * panels, 4), layout="constrained")
    axes = list(fig.subplots(1, panels, squeeze=False)[0])
    for ax, mode in zip(axes, modes, strict=False):
        for name in names:
            ax.plot(result.lengths, [result.times[name, mode, n] for n in result.lengths],
                    marker="o", label=name)
        ax.set(xscale="log", yscale="log", xlabel="sequence length L", ylabel="median ms",
               title=f"time, {mode}")
        ax.legend()
    if result.memory:
        ax = axes[-1]
        for name in names:
            ax.plot(result.lengths, [result.memory[name, n] for n in result.lengths],
                    marker="o", label=name)
        ax.set(xscale="log", yscale="log", xlabel="sequence length L",
               ylabel="peak MiB (fwd + bwd)", title="memory")
        ax.legend()
    fig.savefig(path, dpi=120)


def main(argv: Sequence[str] | None = None) -> Result:
    parser = argparse.ArgumentParser(prog="python -m mha_lib.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512, 1024])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (1 gives steadier numbers on a busy machine)")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds; the median is kept")
    parser.add_argument("--repeat", type=int, default=1, help="calls per timed sample")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--compile", action="store_true", help="also time torch.compile")
    parser.add_argument("--no-memory", action="store_true", help="skip peak memory")
    parser.add_argument("--plot", default="bench.png", help="where to save the plot ('' = none)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    result = benchmark(args.lengths, args.batch, args.d_model, args.heads,
                       getattr(torch, args.dtype), args.device, args.rounds, args.repeat,
                       modes=args.modes, compile_=args.compile, memory=not args.no_memory)
    print(f"batch {args.batch}, d_model {args.d_model}, {args.heads} heads, {args.dtype}, "
          f"{args.device}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"median of {args.rounds} interleaved rounds")
    print(format_table(result))
    if args.plot:
        plot(result, args.plot)
        print(f"plot saved to {args.plot}")
    return result


if __name__ == "__main__":
    main()
