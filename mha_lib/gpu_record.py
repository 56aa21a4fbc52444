"""What the chapters quote for a GPU, measured section by section.

Run it on a machine with a CUDA GPU (a few minutes, some of it
compiling)::

    python -m mha_lib.gpu_record --out my_gpu.json

It writes one JSON file with a section per measurement, each filled in as
it ends (a section that fails holds its error and the run goes on):

* ``env``: torch, CUDA and cuDNN versions, the GPU's name;
* ``ceilings``: the rates to compare with: a bfloat16 matrix product of
  8192 cubed (TFLOP/s) and a device-to-device copy (TB/s, bytes read plus
  written);
* ``bench``: :func:`mha_lib.bench.benchmark` in bfloat16, B=4,
  d_model=1024, 16 heads, L = 1024 to 8192 (chapter 13); and the book's
  base size in float32 (B=8, d_model=512, 8 heads);
* ``steps``: the explicit path's steps timed one by one at B=4, H=16,
  L=4096, D=64, bfloat16, against the fused kernel, with the FLOPs and
  bytes each must do (chapter 13's roofline);
* ``profile``: the CUDA kernels of one forward of the fused module and of
  :class:`mha_lib.bench.CombinedQKV` at L=8192;
* ``overhead``: per length, one call alone, calls queued back to back,
  and the host's time per call, for the three fast modules;
* ``parts``: per length, the host's time per call with an idle GPU, and
  the GPU's time per call for each module and for its pieces (input
  projections; SDPA on its q, k, v layout);
* ``decode``: one-token decoding steps after a 4,096-token cache
  (d_model 4096, 32 heads, batch 16): SDPA's default dispatch against the
  flash and memory-efficient back ends pinned, for GQA with 32, 8 and 1
  key/value heads, and MLA's explicit and absorbed forms (chapters 14,
  18);
* ``bench_compiled``: the forward with ``torch.compile`` of the fused
  path;
* ``flex``: compiled FlexAttention against SDPA (dense mask,
  ``is_causal=True``) for causal, a 256-token window and ALiBi, at
  L = 4096 and 16384 (chapter 17);
* ``empty_rows``: what each SDPA back end and ``nn.MultiheadAttention``
  return for a query with no key to attend (chapter 11).

Times are medians of CUDA-event timings (or of
:func:`mha_lib.bench.benchmark`'s interleaved rounds). ``--smoke`` runs
every section at tiny sizes on the CPU (a test of the script, not a
measurement). :func:`recorded` returns the record the book quotes.
"""

# The timed lambdas are called at once, inside the loop that binds them.
# ruff: noqa: B023
from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import time
import traceback
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from mha_lib.alibi import alibi_bias, alibi_slopes
from mha_lib.bench import CombinedQKV, benchmark
from mha_lib.heads import split_heads
from mha_lib.interop import to_torch_mha
from mha_lib.masks import padding_mask, sliding_window_mask
from mha_lib.mha import MultiHeadAttention

__all__ = ["main", "recorded"]


def recorded(name: str = "h200") -> dict:
    """A record this module wrote, as the library ships it: ``"h200"`` is
    the one the chapters quote (five runs on NVIDIA H200 machines, torch
    2.11.0+cu130, 2026-11-28; its ``"about"`` says which section came from
    which run).

    Args:
        name: The record's name, a file ``mha_lib/data/<name>.json``.

    Returns:
        dict: One key per section (``"ceilings"``, ``"steps"``,
        ``"profile"``, ``"bench"``, ``"parts"``, ``"overhead"``,
        ``"bench_compiled"``, ``"flex"``, ``"empty_rows"``, ``"decode"``),
        the earlier runs of a section (``"overhead_third_run"``,
        ``"decode_fourth_run"``), and ``"about"``, ``"date"``,
        ``"command"``, ``"nvidia_smi"`` and ``"env"`` (``"env_second_run"``
        and so on: the torch, CUDA and cuDNN versions of each run).
    """
    from importlib.resources import files

    path = files("mha_lib").joinpath("data", f"{name}.json")
    if not path.is_file():
        raise ValueError(
            f"recorded: name must be one of the shipped records "
            f"['h200'], got {name!r}"
        )
    return json.loads(path.read_text())


def _median_ms(
    fn: Callable[[], object], device: str, rounds: int = 20, warmup: int = 3
) -> float:
    """Median milliseconds of ``fn()``: CUDA events on a GPU, wall time on
    the CPU."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(rounds):
        if device == "cuda":
            start, end = (
                torch.cuda.Event(enable_timing=True) for _ in range(2)
            )
            torch.cuda.synchronize()
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def env(device: str) -> dict:
    out = {"torch": torch.__version__, "device": device}
    if device == "cuda":
        out.update(
            gpu=torch.cuda.get_device_name(),
            cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version(),
        )
    return out


def ceilings(device: str, n: int, copy_mib: int) -> dict:
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    ms = _median_ms(lambda: a @ a, device, rounds=10)
    src = torch.empty(copy_mib * 2**20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_ms = _median_ms(lambda: dst.copy_(src), device, rounds=10)
    return {
        "matmul_n": n,
        "matmul_ms": ms,
        "matmul_tflops": 2 * n**3 / ms / 1e9,
        "copy_mib": copy_mib,
        "copy_ms": copy_ms,
        "copy_tbps": 2 * src.numel() / copy_ms / 1e9,
    }


def _result_json(result) -> dict:
    return {
        "lengths": result.lengths,
        "batch": result.batch,
        "d_model": result.d_model,
        "times_ms": [[i, m, n, t] for (i, m, n), t in result.times.items()],
        "memory_mib": [[i, n, v] for (i, n), v in result.memory.items()],
        "matmul_gflops": [[n, v] for n, v in result.matmul_gflops.items()],
    }


def bench(
    device: str,
    lengths: Sequence[int],
    d_model: int,
    heads: int,
    base_lengths: Sequence[int],
    compile_: bool,
) -> dict:
    low = benchmark(
        lengths,
        batch=4,
        d_model=d_model,
        num_heads=heads,
        dtype=torch.bfloat16,
        device=device,
        rounds=9,
        warmup=2,
        compile_=compile_,
        matmul_size=4096 if device == "cuda" else 64,
        progress=False,
    )
    base = benchmark(
        base_lengths,
        batch=8,
        d_model=512 if device == "cuda" else 32,
        num_heads=8,
        dtype=torch.float32,
        device=device,
        rounds=9,
        warmup=2,
        matmul_size=4096 if device == "cuda" else 64,
        progress=False,
    )
    return {
        "bfloat16": {"heads": heads, **_result_json(low)},
        "float32_base": {"heads": 8, **_result_json(base)},
    }


def steps(device: str, B: int, H: int, L: int, D: int) -> dict:
    """The explicit path's steps, one at a time, and the fused kernel."""
    dt = torch.bfloat16
    q, k, v = (
        torch.randn(B, H, L, D, device=device, dtype=dt) for _ in range(3)
    )
    s = q @ k.mT
    p = s.softmax(-1)
    n2 = B * H * L * L  # numbers in one (B, H, L, L) tensor
    n1 = B * H * L * D  # numbers in one (B, H, L, D) tensor
    size = 2  # bytes per bfloat16
    rows = {
        "scores Q K^T": (
            lambda: q @ k.mT,
            2 * n2 * D,
            (2 * n1 + n2) * size,
        ),
        "scale": (lambda: s * D**-0.5, n2, 2 * n2 * size),
        "softmax": (lambda: s.softmax(-1), 5 * n2, 2 * n2 * size),
        "P V": (lambda: p @ v, 2 * n2 * D, (n2 + 2 * n1) * size),
        "fused SDPA": (
            lambda: F.scaled_dot_product_attention(q, k, v),
            4 * n2 * D,
            4 * n1 * size,
        ),
    }
    out = {"shape": [B, H, L, D], "dtype": "bfloat16"}
    for name, (fn, flops, nbytes) in rows.items():
        ms = _median_ms(fn, device)
        out[name] = {
            "ms": ms,
            "flops": flops,
            "bytes": nbytes,
            "tflops": flops / ms / 1e9,
            "tbps": nbytes / ms / 1e9,
        }
    return out


def profile(device: str, L: int, d_model: int, heads: int) -> dict:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof_

    torch.manual_seed(0)
    ours = (
        MultiHeadAttention(d_model, heads).to(device, torch.bfloat16).eval()
    )
    combined = CombinedQKV.like(ours).eval()
    x = torch.randn(4, L, d_model, device=device, dtype=torch.bfloat16)
    activities = [ProfilerActivity.CPU] + (
        [ProfilerActivity.CUDA] if device == "cuda" else []
    )
    out = {}
    for name, fn in (
        ("fused", lambda: ours(x, need_weights=False)[0]),
        ("combined", lambda: combined(x)),
    ):
        with torch.no_grad():
            for _ in range(3):
                fn()
            if device == "cuda":
                torch.cuda.synchronize()
            with prof_(activities=activities) as prof:
                for _ in range(5):
                    fn()
                if device == "cuda":
                    torch.cuda.synchronize()
        rows = []
        for e in prof.key_averages():
            t = getattr(
                e,
                "self_device_time_total",
                getattr(e, "self_cuda_time_total", 0),
            )
            if device != "cuda":
                t = e.self_cpu_time_total
            if t > 0 and e.key.startswith(("aten::", "cuda")) is (
                device != "cuda"
            ):
                rows.append([e.key[:120], e.count, t / 5 / 1e3])
        rows.sort(key=lambda r: -r[2])
        out[name] = rows[:15]
        out[name + "_table"] = prof.key_averages().table(
            sort_by="self_cuda_time_total"
            if device == "cuda"
            else "self_cpu_time_total",
            row_limit=15,
            max_name_column_width=60,
        )
    return out


def overhead(
    device: str,
    lengths: Sequence[int],
    d_model: int,
    heads: int,
    calls: int = 20,
) -> dict:
    """Per length: one call timed alone (launch included: what
    mha_lib.bench measures) and ``calls`` calls queued back to back (the
    GPU's time per call), for the fused module, CombinedQKV and
    nn.MultiheadAttention; and the attention kernel each one ran."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof_

    torch.manual_seed(0)
    ours = (
        MultiHeadAttention(d_model, heads).to(device, torch.bfloat16).eval()
    )
    impls = {
        "fused": lambda x: ours(x, need_weights=False)[0],
        "combined": CombinedQKV.like(ours).eval(),
        "torch": (lambda m: lambda x: m(x, x, x, need_weights=False)[0])(
            to_torch_mha(ours).eval()
        ),
    }
    rows = []
    for L in lengths:
        x = torch.randn(4, L, d_model, device=device, dtype=torch.bfloat16)
        for name, fn in impls.items():
            with torch.no_grad():
                alone = _median_ms(lambda: fn(x), device)
                queued = (
                    _median_ms(
                        lambda: [fn(x) for _ in range(calls)],
                        device,
                        rounds=7,
                    )
                    / calls
                )
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn(x)
                host = (time.perf_counter() - t0) * 1e3 / calls
                if device == "cuda":
                    torch.cuda.synchronize()
                acts = [ProfilerActivity.CPU] + (
                    [ProfilerActivity.CUDA] if device == "cuda" else []
                )
                with prof_(activities=acts) as prof:
                    fn(x)
                    if device == "cuda":
                        torch.cuda.synchronize()
            kernels = sorted(
                {
                    e.key[:90]
                    for e in prof.key_averages()
                    if "attention" in e.key.lower()
                    or "sdpa" in e.key.lower()
                    or "fmha" in e.key.lower()
                }
            )
            rows.append(
                {
                    "L": L,
                    "impl": name,
                    "alone_ms": alone,
                    "queued_ms": queued,
                    "host_ms_unsynced": host,
                    "attention_ops": kernels,
                }
            )
    return {
        "batch": 4,
        "d_model": d_model,
        "heads": heads,
        "dtype": "bfloat16",
        "rows": rows,
    }


def parts(
    device: str,
    lengths: Sequence[int],
    d_model: int,
    heads: int,
    calls: int = 20,
) -> dict:
    """Where a forward's time goes, per length, for the fused module,
    CombinedQKV and nn.MultiheadAttention: the host's time per call with
    an idle GPU (the Python and launch cost), and the GPU's time per call
    with ``calls`` calls queued back to back, for the whole module, its
    input projections, and SDPA on its own q, k, v layout."""
    torch.manual_seed(0)
    ours = MultiHeadAttention(d_model, heads).to(device, torch.bfloat16)
    ours.eval()
    comb = CombinedQKV.like(ours).eval()
    theirs = to_torch_mha(ours).eval()
    rows = []
    for L in lengths:
        x = torch.randn(4, L, d_model, device=device, dtype=torch.bfloat16)
        with torch.no_grad():
            q, k, v = (
                split_heads(p(x), heads)
                for p in (ours.q_proj, ours.k_proj, ours.v_proj)
            )
            q2, k2, v2 = (
                comb.qkv(x).view(4, L, 3, heads, -1).permute(2, 0, 3, 1, 4)
            )
            full = {
                "fused": lambda: ours(x, need_weights=False),
                "combined": lambda: comb(x),
                "torch": lambda: theirs(x, x, x, need_weights=False),
            }
            row: dict = {"L": L, "host_idle_ms": {}, "queued_ms": {}}
            for name, fn in full.items():
                host = []
                for _ in range(3):
                    fn()
                for _ in range(30):
                    if device == "cuda":
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    fn()
                    host.append((time.perf_counter() - t0) * 1e3)
                row["host_idle_ms"][name] = statistics.median(host)
            pieces = {
                **full,
                "fused: 3 projections": lambda: [
                    p(x) for p in (ours.q_proj, ours.k_proj, ours.v_proj)
                ],
                "combined: 1 projection": lambda: comb.qkv(x),
                "SDPA, fused's q k v": lambda: (
                    F.scaled_dot_product_attention(q, k, v)
                ),
                "SDPA, combined's q k v": lambda: (
                    F.scaled_dot_product_attention(q2, k2, v2)
                ),
            }
            for name, fn in pieces.items():
                row["queued_ms"][name] = (
                    _median_ms(
                        lambda: [fn() for _ in range(calls)],
                        device,
                        rounds=9,
                    )
                    / calls
                )
        rows.append(row)
    return {
        "batch": 4,
        "d_model": d_model,
        "heads": heads,
        "dtype": "bfloat16",
        "calls": calls,
        "rows": rows,
    }


def _decode_ms(module, cache, new, pinned, **kw) -> tuple[list, list]:
    """Milliseconds of each one-token step of ``module`` over ``new``
    (B, T, d_model), appending to ``cache``, and the attention operators
    of the last step; ``pinned``: SDPA limited to the flash and
    memory-efficient back ends (math only where both refuse)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.profiler import profile as prof_

    times = []
    device = new.device.type

    def ctx():
        return (
            sdpa_kernel(
                [
                    SDPBackend.FLASH_ATTENTION,
                    SDPBackend.EFFICIENT_ATTENTION,
                    SDPBackend.MATH,
                ]
            )
            if pinned
            else contextlib.nullcontext()
        )

    for t in range(new.size(1) - 1):
        with ctx(), torch.no_grad():
            times.append(
                _median_ms(
                    lambda: module(
                        new[:, t : t + 1],
                        cache=cache,
                        need_weights=False,
                        **kw,
                    ),
                    device,
                    rounds=1,
                    warmup=0,
                )
            )
    with ctx(), torch.no_grad(), prof_() as prof:
        module(new[:, -1:], cache=cache, need_weights=False, **kw)
    ops = sorted(
        {
            e.key[:60]
            for e in prof.key_averages()
            if "attention" in e.key.lower()
        }
    )
    return times, ops


def decode(
    device: str,
    d_model: int,
    heads: int,
    prompt: int,
    batch: int,
    steps: int,
) -> dict:
    """One-token decoding steps after a ``prompt``-token cache, bfloat16
    on a GPU: SDPA's default dispatch against flash/efficient pinned
    (chapter 14's note); GQA with 32, 8 and 1 key/value heads; MLA's
    explicit and absorbed forms (chapters 14, 18). Each step is timed
    alone (synchronized); medians over ``steps`` steps."""
    import copy

    from mha_lib.cache import KVCache
    from mha_lib.gqa import GroupedQueryAttention
    from mha_lib.latent import MultiHeadLatentAttention

    dt = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    x = torch.randn(batch, prompt, d_model, device=device, dtype=dt)
    new = torch.randn(batch, steps, d_model, device=device, dtype=dt)
    out: dict = {
        "d_model": d_model,
        "heads": heads,
        "prompt": prompt,
        "batch": batch,
        "steps": steps,
        "dtype": str(dt).removeprefix("torch."),
    }

    def filled(module, **kw):
        cache = KVCache()
        with torch.no_grad():
            module(x, is_causal=True, cache=cache, need_weights=False, **kw)
        return cache

    rows = []
    for kv in (heads, heads // 4, 1):
        module = GroupedQueryAttention(d_model, heads, kv).to(device, dt)
        module.eval()
        base = filled(module)
        head_dim = d_model // heads
        row: dict = {
            "module": f"GQA H_kv={kv}",
            "kv_heads": kv,
            "cache_bytes": 2
            * batch
            * kv
            * prompt
            * head_dim
            * (2 if dt == torch.bfloat16 else 4),
        }
        for pinned in (False, True):
            times, ops = _decode_ms(
                module, copy.deepcopy(base), new, pinned
            )
            row[("pinned" if pinned else "default") + "_ops"] = ops
            row["pinned_ms" if pinned else "default_ms"] = (
                statistics.median(times)
            )
            row[("pinned" if pinned else "default") + "_first_ms"] = times[
                0
            ]
        rows.append(row)
    mla = MultiHeadLatentAttention(
        d_model, heads, 4 * (d_model // heads), d_model // heads // 2
    ).to(device, dt)
    mla.eval()
    base = filled(mla)
    for absorb in (False, True):
        times, ops = _decode_ms(
            mla, copy.deepcopy(base), new, True, absorb=absorb
        )
        rows.append(
            {
                "module": "MLA " + ("absorbed" if absorb else "explicit"),
                "pinned_ms": statistics.median(times[1:]),
                "pinned_first_ms": times[0],
                "pinned_ops": ops,
            }
        )
    out["rows"] = rows
    return out


def flex(
    device: str,
    lengths: Sequence[int],
    alibi_lengths: Sequence[int],
    B: int,
    H: int,
    D: int,
    window: int,
) -> dict:
    from torch.nn.attention.flex_attention import (
        create_block_mask,
        flex_attention,
    )

    dt = torch.bfloat16 if device == "cuda" else torch.float32
    compiled = torch.compile(flex_attention, dynamic=False)
    slopes = torch.tensor(alibi_slopes(H), device=device)

    def causal(b, h, i, j):
        return i >= j

    def win(b, h, i, j):
        return (i >= j) & (i - j < window)

    def alibi(score, b, h, i, j):
        return score + slopes[h] * (j - i)

    out: dict = {
        "B": B,
        "H": H,
        "D": D,
        "window": window,
        "dtype": str(dt).removeprefix("torch."),
        "rows": [],
    }
    for L in lengths:
        torch.manual_seed(0)
        q, k, v = (
            torch.randn(B, H, L, D, device=device, dtype=dt)
            for _ in range(3)
        )
        cases = [
            (
                "causal",
                causal,
                None,
                torch.ones(L, L, dtype=torch.bool, device=device).tril(),
            ),
            (
                f"window {window}",
                win,
                None,
                sliding_window_mask(L, window, device=device),
            ),
        ]
        if L in alibi_lengths:
            cases.append(
                (
                    "ALiBi + causal",
                    causal,
                    alibi,
                    alibi_bias(H, L, device=device)
                    .masked_fill(~cases[0][3], float("-inf"))
                    .to(dt),
                )
            )
        for name, mask_mod, score_mod, dense in cases:
            row: dict = {"case": name, "L": L}
            try:
                t0 = time.perf_counter()
                block = create_block_mask(
                    mask_mod, None, None, L, L, device=device
                )
                got = compiled(
                    q, k, v, score_mod=score_mod, block_mask=block
                )
                if device == "cuda":
                    torch.cuda.synchronize()
                row["first_call_s"] = time.perf_counter() - t0
                want = F.scaled_dot_product_attention(q, k, v, dense)
                row["max_diff"] = (
                    (got.float() - want.float()).abs().max().item()
                )
                row["flex_ms"] = _median_ms(
                    lambda: compiled(
                        q, k, v, score_mod=score_mod, block_mask=block
                    ),
                    device,
                )
                row["sdpa_dense_ms"] = _median_ms(
                    lambda: F.scaled_dot_product_attention(q, k, v, dense),
                    device,
                )
                if name == "causal":
                    row["sdpa_is_causal_ms"] = _median_ms(
                        lambda: F.scaled_dot_product_attention(
                            q, k, v, is_causal=True
                        ),
                        device,
                    )
                row["sdpa_none_ms"] = _median_ms(
                    lambda: F.scaled_dot_product_attention(q, k, v), device
                )
                row["block_mask_ms"] = _median_ms(
                    lambda: create_block_mask(
                        mask_mod, None, None, L, L, device=device
                    ),
                    device,
                    rounds=5,
                    warmup=1,
                )
                row["blocks_computed"] = int(
                    block.kv_num_blocks.sum()
                    + block.full_kv_num_blocks.sum()
                )
                row["blocks_total"] = (L // 128) ** 2
            except Exception as error:  # noqa: BLE001 - record it, go on
                row["error"] = f"{type(error).__name__}: {str(error)[:400]}"
            out["rows"].append(row)
    return out


def empty_rows(device: str) -> dict:
    """NaN or zero for a query whose keys are all masked: each SDPA back end
    (bool mask with one all-False row) and nn.MultiheadAttention's paths."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out: dict = {"sdpa": [], "nn_mha": []}
    torch.manual_seed(0)
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        q, k, v = (
            torch.randn(2, 4, 8, 64, device=device, dtype=dt)
            for _ in range(3)
        )
        mask = torch.ones(2, 1, 8, 8, dtype=torch.bool, device=device)
        mask[1, :, 3] = False  # batch 1, query 3 sees no key
        for backend in (
            "MATH",
            "EFFICIENT_ATTENTION",
            "FLASH_ATTENTION",
            "CUDNN_ATTENTION",
            "default",
        ):
            row = {
                "dtype": str(dt).removeprefix("torch."),
                "backend": backend,
            }
            try:
                if backend == "default":
                    got = F.scaled_dot_product_attention(q, k, v, mask)
                else:
                    with sdpa_kernel([getattr(SDPBackend, backend)]):
                        got = F.scaled_dot_product_attention(q, k, v, mask)
                bad = got[1, :, 3].float()
                row["nan"] = int(bad.isnan().sum())
                row["zero"] = bool((bad == 0).all())
                row["of"] = bad.numel()
                # Uniform weights over every key would give the mean value.
                mean_v = v[1].float().mean(dim=-2)  # (H, D)
                row["max_abs"] = bad.abs().max().item()
                row["diff_from_mean_v"] = (bad - mean_v).abs().max().item()
            except Exception as error:  # noqa: BLE001 - a back end refusing
                row["error"] = f"{type(error).__name__}: {str(error)[:160]}"
            out["sdpa"].append(row)
    torch.manual_seed(0)
    ours = MultiHeadAttention(8, 4)
    x = torch.randn(4, 6, 8, device=device)
    blocked = ~padding_mask(torch.tensor([6, 6, 6, 0]), 6)[:, 0, 0].to(
        device
    )
    for what, train, need, grad in (
        ("need_weights=True, training", True, True, True),
        ("need_weights=False, training", True, False, True),
        ("need_weights=False, eval, grad on", False, False, True),
        ("need_weights=True, eval + no_grad", False, True, False),
        ("need_weights=False, eval + no_grad", False, False, False),
    ):
        t = to_torch_mha(ours).to(device).train(train)
        with torch.set_grad_enabled(grad):
            got, _ = t(x, x, x, key_padding_mask=blocked, need_weights=need)
        out["nn_mha"].append(
            {"mode": what, "nan": int(got[3, 0].isnan().sum()), "of": 8}
        )
    return out


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        prog="python -m mha_lib.gpu_record",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", default="gpu_record.json")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes on the CPU: tests the script only",
    )
    parser.add_argument(
        "--only", nargs="+", default=None, help="run only these sections"
    )
    args = parser.parse_args(argv)
    smoke = args.smoke
    device = "cpu" if smoke else "cuda"
    if not smoke and not torch.cuda.is_available():
        parser.error("no CUDA GPU here (use --smoke to test the script)")
    sections: dict[str, Callable[[], dict]] = {
        "env": lambda: env(device),
        "ceilings": lambda: ceilings(
            device, 64 if smoke else 8192, 1 if smoke else 1024
        ),
        "steps": lambda: steps(
            device, *((1, 2, 64, 8) if smoke else (4, 16, 4096, 64))
        ),
        "empty_rows": lambda: empty_rows(device),
        "profile": lambda: profile(
            device,
            64 if smoke else 8192,
            32 if smoke else 1024,
            4 if smoke else 16,
        ),
        "bench": lambda: bench(
            device,
            [32, 64] if smoke else [1024, 2048, 4096, 8192],
            32 if smoke else 1024,
            4 if smoke else 16,
            [32] if smoke else [1024, 4096],
            compile_=False,
        ),
        "overhead": lambda: overhead(
            device,
            [64] if smoke else [1024, 2048, 4096, 8192],
            32 if smoke else 1024,
            4 if smoke else 16,
        ),
        "parts": lambda: parts(
            device,
            [64] if smoke else [1024, 2048, 4096],
            32 if smoke else 1024,
            4 if smoke else 16,
        ),
        "decode": lambda: decode(
            device,
            32 if smoke else 4096,
            4 if smoke else 32,
            16 if smoke else 4096,
            2 if smoke else 16,
            4 if smoke else 12,
        ),
        "bench_compiled": lambda: _result_json(
            benchmark(
                [64] if smoke else [2048, 8192],
                batch=4,
                d_model=32 if smoke else 1024,
                num_heads=4 if smoke else 16,
                dtype=torch.bfloat16,
                device=device,
                rounds=9,
                warmup=2,
                modes=("fwd",),
                compile_=True,
                memory=False,
                matmul_size=64 if smoke else 4096,
                progress=False,
            )
        ),
        "flex": lambda: flex(
            device,
            [128] if smoke else [4096, 16384],
            [128] if smoke else [4096],
            1 if smoke else 4,
            2 if smoke else 16,
            8 if smoke else 64,
            32 if smoke else 256,
        ),
    }
    record: dict = {
        "command": "python -m mha_lib.gpu_record"
        + (" --smoke" if smoke else "")
    }
    for name, fn in sections.items():
        if args.only and name not in args.only:
            continue
        start = time.perf_counter()
        try:
            record[name] = fn()
        except Exception as error:  # noqa: BLE001 - record it, go on
            record[name] = {
                "error": f"{type(error).__name__}: {error}",
                "trace": traceback.format_exc(limit=3),
            }
        record[name + "_seconds"] = round(time.perf_counter() - start, 1)
        print(f"{name}: {record[name + '_seconds']} s", flush=True)
        with open(args.out, "w") as f:
            json.dump(
                record,
                f,
                indent=1,
                default=lambda o: (
                    None
                    if isinstance(o, float) and math.isnan(o)
                    else str(o)
                ),
            )
    return record


if __name__ == "__main__":
    main()
