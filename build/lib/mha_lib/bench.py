"""Time and memory of multi-head attention, ours against the strongest
peers (chapter 13).

Run ``python -m mha_lib.bench --help``. For every sequence length it
measures, in one process and interleaved (round-robin, rotating the order,
so that a slower moment of the machine hits every implementation alike):

* ``explicit``: ``MultiHeadAttention(need_weights=True)``, the path the book
  derives;
* ``fused``: ``MultiHeadAttention(need_weights=False)``, its four
  ``nn.Linear`` layers around ``F.scaled_dot_product_attention``;
* ``combined``: :class:`CombinedQKV`, the shortest fast module a reader
  could write: one ``nn.Linear`` to ``3 * d_model`` for Q, K and V, then
  ``F.scaled_dot_product_attention``;
* ``torch``: ``nn.MultiheadAttention(batch_first=True)``,
  ``need_weights=False``;
* ``compiled`` (``--compile``): ``torch.compile`` of the fused path.

All share the same weights. Each is timed in two modes: ``fwd`` (eval mode,
no gradients: what inference runs; ``nn.MultiheadAttention`` then takes its
native fast path) and ``train`` (forward and backward). The table gives
median milliseconds and the ratios of ``fused`` to ``combined`` and to
``torch``. In the same rounds it times a float matrix product of
``matmul_size`` cubed, this machine's matrix-multiply rate, and reports the
fused forward's rate (the FLOPs of its matrix products per second) as a
fraction of it. Peak memory of one forward and backward is measured once per
length: on CUDA with the allocator's peak counter, on the CPU from the
profiler's allocation events.
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
import torch.nn.functional as F
from torch import nn

from mha_lib.interop import to_torch_mha
from mha_lib.mha import MultiHeadAttention

__all__ = ["CombinedQKV", "Result", "attention_flops", "benchmark",
           "format_table", "main", "peak_memory"]

MODES = ("fwd", "train")
ORDER = ("explicit", "fused", "combined", "compiled", "torch")


class CombinedQKV(nn.Module):
    """Self-attention as a reader would write it for speed: one linear
    layer for Q, K and V, then ``F.scaled_dot_product_attention``.
    ``CombinedQKV.like(m)`` copies the weights of a
    :class:`~mha_lib.MultiHeadAttention`.

    Args:
        d_model: Width of every token vector.
        num_heads: Number of heads; must divide ``d_model``.
    """

    def __init__(self, d_model: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``(B, L, d_model)`` -> ``(B, L, d_model)``.

        Args:
            x: The tokens, ``(B, L, d_model)``; self-attention, no mask.
        """
        batch, length, d_model = x.shape
        qkv = self.qkv(x).view(batch, length, 3, self.num_heads, -1)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # 3 x (B, H, L, D)
        out = F.scaled_dot_product_attention(q, k, v)  # (B, H, L, D)
        return self.out(out.transpose(1, 2).reshape(batch, length, d_model))

    @classmethod
    def like(cls, m: MultiHeadAttention) -> CombinedQKV:
        """A ``CombinedQKV`` with ``m``'s weights, device and dtype.

        Args:
            m: The module whose ``q_proj``, ``k_proj`` and ``v_proj`` are
                stacked into one layer (they need biases).
        """
        weight = m.q_proj.weight
        peer = cls(m.d_model, m.num_heads).to(weight.device, weight.dtype)
        with torch.no_grad():
            layers = (m.q_proj, m.k_proj, m.v_proj)
            peer.qkv.weight.copy_(torch.cat([p.weight for p in layers]))
            peer.qkv.bias.copy_(torch.cat([p.bias for p in layers]))
            peer.out.load_state_dict(m.out_proj.state_dict())
        return peer


def attention_flops(batch: int, length: int, d_model: int) -> int:
    """FLOPs of the matrix products of one self-attention forward: four
    projections, ``8 B L d_model^2``, and ``Q K^T`` and ``P V``,
    ``4 B L^2 d_model`` (a multiply-add is 2 FLOPs; chapter 13).

    Args:
        batch: The batch size ``B``.
        length: The sequence length ``L``.
        d_model: The model width.
    """
    return 8 * batch * length * d_model**2 + 4 * batch * length**2 * d_model


@dataclass
class Result:
    """Median times (ms) per (implementation, mode, length), peak memory
    (MiB) per (implementation, length), matmul rate (GFLOP/s) per length.

    :func:`benchmark` makes one; its fields are its arguments.

    Args:
        lengths: The sequence lengths measured.
        batch: The batch size ``B``.
        d_model: The model width.
        times: Median time in ms per ``(impl, mode, length)``: ``impl`` is
            ``"explicit"``, ``"fused"``, ``"combined"``, ``"torch"`` or
            ``"compiled"``; ``mode`` is ``"fwd"`` or ``"train"``.
        memory: Peak memory in MiB per ``(impl, length)``.
        matmul_gflops: This machine's matmul rate in GFLOP/s per length.
    """

    lengths: list[int]
    batch: int = 8
    d_model: int = 512
    times: dict[tuple[str, str, int], float] = field(default_factory=dict)
    memory: dict[tuple[str, int], float] = field(default_factory=dict)
    matmul_gflops: dict[int, float] = field(default_factory=dict)

    def ratio(self, impl: str, mode: str, length: int,
              reference: str = "torch") -> float:
        """Median time of ``impl`` over that of ``reference``.

        Args:
            impl, reference: Implementations, keys of ``times``
                (``"explicit"``, ``"fused"``, ``"torch"``...).
            mode: ``"fwd"`` or ``"train"``.
            length: One of ``lengths``.
        """
        return (self.times[impl, mode, length]
                / self.times[reference, mode, length])

    def fused_gflops(self, length: int) -> float:
        """The fused forward's rate: its matrix products' FLOPs per
        second, in GFLOP/s.

        Args:
            length: One of ``lengths``.
        """
        flops = attention_flops(self.batch, length, self.d_model)
        return flops / self.times["fused", "fwd", length] / 1e6

    def matmul_fraction(self, length: int) -> float:
        """The fused forward's rate over this machine's matmul rate.

        Args:
            length: One of ``lengths``.
        """
        return self.fused_gflops(length) / self.matmul_gflops[length]


def _implementations(d_model: int, num_heads: int, device: str,
                     dtype: torch.dtype, compile_: bool
                     ) -> tuple[dict[str, Callable], list[nn.Module]]:
    ours = MultiHeadAttention(d_model, num_heads).to(device, dtype)
    combined = CombinedQKV.like(ours)
    reference = to_torch_mha(ours)
    impls: dict[str, Callable] = {
        "explicit": lambda x: ours(x, need_weights=True)[0],
        "fused": lambda x: ours(x, need_weights=False)[0],
        "combined": combined,
        "torch": lambda x: reference(x, x, x, need_weights=False)[0],
    }
    if compile_:
        impls["compiled"] = torch.compile(
            lambda x: ours(x, need_weights=False)[0])
    return impls, [ours, combined, reference]


def _step(fn: Callable, x: torch.Tensor, mode: str) -> None:
    if mode == "fwd":
        with torch.no_grad():
            fn(x)
    else:
        fn(x).sum().backward()


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _timed(fn: Callable[[], object], device: str) -> float:
    """Milliseconds of one call."""
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return (time.perf_counter() - start) * 1e3


@contextlib.contextmanager
def _quiet_stderr():
    """Silence file descriptor 2: the CPU profiler writes log lines straight
    to it, past Python's sys.stderr (and so into notebook outputs)."""
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


def peak_memory(fn: Callable[[torch.Tensor], torch.Tensor],
                x: torch.Tensor, backward: bool = True) -> float:
    """Peak memory (MiB) allocated during one forward (and backward) of
    ``fn(x)``, beyond what was allocated before it.

    Args:
        fn: The computation, ``x`` -> a tensor.
        x: Its input.
        backward: Also run the backward pass of ``fn(x).sum()``.
    """

    def run() -> None:
        out = fn(x)
        if backward:
            out.sum().backward()

    if x.device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        run()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2**20
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU],
                                  profile_memory=True) as prof:
        run()
    # Every event's own allocations (+) and frees (-), in time order: the
    # running sum is the memory held at each moment, its maximum the peak.
    # An operation's own frees of what its sub-operations made happen after
    # them, so an event with sub-events counts its own change at its end.
    changes = sorted(
        (e.time_range.end if e.cpu_children else e.time_range.start,
         e.self_cpu_memory_usage) for e in prof.events())
    current = peak = 0
    for _, change in changes:
        current += change
        peak = max(peak, current)
    return peak / 2**20


def benchmark(lengths: Sequence[int], batch: int = 8, d_model: int = 512,
              num_heads: int = 8, dtype: torch.dtype = torch.float32,
              device: str = "cpu", rounds: int = 7, warmup: int = 2,
              modes: Sequence[str] = MODES, compile_: bool = False,
              memory: bool = True, matmul_size: int = 2048,
              progress: bool = True) -> Result:
    """Interleaved timing of every implementation at every length; medians
    of ``rounds`` after ``warmup`` rounds. ``rounds=0`` skips the timing
    (memory only).

    Args:
        lengths: Sequence lengths ``L`` to measure.
        batch: Batch size ``B``.
        d_model: Model width.
        num_heads: Number of heads.
        dtype: Floating dtype of inputs and weights.
        device: ``"cpu"`` or ``"cuda"``.
        rounds: Timed rounds per length and mode; the median is kept.
        warmup: Untimed rounds first.
        modes: ``"fwd"`` (eval, no gradients) and/or ``"train"``.
        compile\\_: Also time ``torch.compile`` of the fused path.
        memory: Also measure peak memory of forward + backward.
        matmul_size: Size ``n`` of the ``n x n`` matrix product timed
            alongside, for the machine's matmul rate.
        progress: Print a progress bar to stderr.
    """
    torch.manual_seed(0)
    impls, modules = _implementations(d_model, num_heads, device, dtype,
                                      compile_)
    names = list(impls)
    result = Result(list(lengths), batch, d_model)
    if rounds == 0:
        modes, warmup = (), 0
    total = max(1, len(lengths) * len(modes) * (warmup + rounds))
    done = 0
    square = torch.randn(matmul_size, matmul_size, device=device,
                         dtype=dtype)

    def matmul() -> torch.Tensor:
        return square @ square
    for length in lengths:
        x = torch.randn(batch, length, d_model, device=device, dtype=dtype)
        matmul_ms: list[float] = []
        for mode in modes:
            for module in modules:  # eval for fwd: nn.MHA's fast path
                module.train(mode == "train")
            xm = x.detach().requires_grad_(mode == "train")
            samples: dict[str, list[float]] = {name: [] for name in names}
            for r in range(warmup + rounds):
                shift = r % len(names)
                for name in names[shift:] + names[:shift]:  # rotate
                    ms = _timed(lambda name=name, xm=xm, mode=mode:
                                _step(impls[name], xm, mode), device)
                    if r >= warmup:
                        samples[name].append(ms)
                if mode == "fwd" and r >= warmup:
                    matmul_ms.append(_timed(matmul, device))
                done += 1
                if progress:
                    _progress(done, total, f"L={length} {mode}")
            for name in names:
                result.times[name, mode, length] = \
                    statistics.median(samples[name])
        if matmul_ms:
            flops = 2 * matmul_size**3
            result.matmul_gflops[length] = \
                flops / statistics.median(matmul_ms) / 1e6
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
    print(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} "
          f"{label:<16}", end="", file=sys.stderr, flush=True)


def _names(result: Result) -> list[str]:
    found = {key[0] for key in [*result.times, *result.memory]}
    return [name for name in ORDER if name in found]


def format_table(result: Result) -> str:
    """The median times (ms), the ratios, the matmul rate and the peak
    memory, as text tables.

    Args:
        result: What :func:`benchmark` returned.
    """
    names = _names(result)
    modes = [m for m in MODES if any(k[1] == m for k in result.times)]
    rows = [(length, mode) for length in result.lengths for mode in modes]
    lines: list[str] = []
    if result.times:
        lines.append(f"{'L':>6} {'mode':>5} "
                     + " ".join(f"{n + ' ms':>11}" for n in names))
        lines += [f"{length:>6} {mode:>5} " + " ".join(
            f"{result.times[n, mode, length]:>11.1f}" for n in names)
            for length, mode in rows]
        lines += ["", f"{'L':>6} {'mode':>5} {'fused/combined':>15} "
                      f"{'fused/torch':>12} {'explicit/fused':>15}"]
        for length, mode in rows:
            ratios = (result.ratio("fused", mode, length, "combined"),
                      result.ratio("fused", mode, length),
                      result.ratio("explicit", mode, length, "fused"))
            lines.append(f"{length:>6} {mode:>5} {ratios[0]:>15.3f} "
                         f"{ratios[1]:>12.3f} {ratios[2]:>15.3f}")
    if result.matmul_gflops:
        lines += ["", f"{'L':>6} {'fused fwd GFLOP/s':>18} "
                      f"{'matmul GFLOP/s':>15} {'fraction':>9}"]
        lines += [f"{length:>6} {result.fused_gflops(length):>18.1f} "
                  f"{result.matmul_gflops[length]:>15.1f} "
                  f"{result.matmul_fraction(length):>9.2f}"
                  for length in result.lengths]
    if result.memory:
        if lines:
            lines.append("")
        lines.append(f"{'L':>6} " + " ".join(f"{n + ' MiB':>12}"
                                             for n in names))
        lines += [f"{length:>6} " + " ".join(
            f"{result.memory[n, length]:>12.1f}" for n in names)
            for length in result.lengths]
    return "\n".join(lines)


def plot(result: Result, path: str | None = None, figure=None):
    """Log-log plots of time per mode and of memory against ``L``; saved
    to ``path`` if given. Returns the matplotlib figure.

    Args:
        result: What :func:`benchmark` measured.
        path: Where to save the figure (PNG), or None.
        figure (matplotlib.figure.Figure | None): A figure to draw in (e.g.
            ``plt.figure()`` in a notebook); by default a new one, outside
            pyplot (no window).
    """
    from matplotlib.figure import Figure

    names = _names(result)
    modes = [m for m in MODES if any(k[1] == m for k in result.times)]
    panels = len(modes) + bool(result.memory)
    fig = figure if figure is not None else Figure(
        figsize=(5 * panels, 4), layout="constrained")
    axes = list(fig.subplots(1, panels, squeeze=False)[0])
    series = [(ax, mode, lambda n, L, mode=mode: result.times[n, mode, L],
               "median ms", f"time, {mode}")
              for ax, mode in zip(axes, modes, strict=False)]
    if result.memory:
        series.append((axes[-1], None, lambda n, L: result.memory[n, L],
                       "peak MiB (fwd + bwd)", "memory"))
    for ax, _, value, ylabel, title in series:
        for name in names:
            ax.plot(result.lengths,
                    [value(name, n) for n in result.lengths],
                    marker="o", label=name)
        ax.set(xscale="log", yscale="log", xlabel="sequence length L",
               ylabel=ylabel, title=title)
        ax.legend()
    if path:
        fig.savefig(path, dpi=120)
    return fig


def main(argv: Sequence[str] | None = None) -> Result:
    """The command line: ``python -m mha_lib.bench [options]``."""
    parser = argparse.ArgumentParser(
        prog="python -m mha_lib.bench", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+",
                        default=[128, 256, 512, 1024])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--dtype", default="float32",
                        choices=["float32", "float16", "bfloat16"])
    parser.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--threads", type=int, default=None,
        help="torch CPU threads (default: PyTorch's choice)")
    parser.add_argument("--rounds", type=int, default=7,
                        help="timed rounds; the median is kept")
    parser.add_argument("--warmup", type=int, default=2,
                        help="untimed rounds first")
    parser.add_argument("--modes", nargs="+", default=list(MODES),
                        choices=MODES)
    parser.add_argument("--matmul-size", type=int, default=2048,
                        help="n of the n x n matmul timed for the rate")
    parser.add_argument("--compile", action="store_true",
                        help="also time torch.compile of the fused path")
    parser.add_argument("--no-memory", action="store_true",
                        help="skip peak memory")
    parser.add_argument("--plot", default="bench.png",
                        help="where to save the plot ('' = none)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    result = benchmark(args.lengths, args.batch, args.d_model, args.heads,
                       getattr(torch, args.dtype), args.device, args.rounds,
                       args.warmup, args.modes, args.compile,
                       not args.no_memory, args.matmul_size)
    print(f"batch {args.batch}, d_model {args.d_model}, "
          f"{args.heads} heads, {args.dtype}, {args.device}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"median of {args.rounds} interleaved rounds")
    print(format_table(result))
    if args.plot:
        plot(result, args.plot)
        print(f"plot saved to {args.plot}")
    return result


if __name__ == "__main__":
    main()
