"""The benchmark runs end to end on tiny sizes and measures what it claims.

No speed is asserted here (timings in unit tests are noise); memory is deterministic
enough: the explicit path keeps the (B, H, L, L) weights, the fused path does not.
"""

import pytest
import torch

from mha_lib import MultiHeadAttention
from mha_lib.bench import (
    CombinedQKV,
    Result,
    attention_flops,
    benchmark,
    format_table,
    main,
    peak_memory,
)


def test_benchmark_times_every_implementation_and_mode():
    result = benchmark([16, 32], batch=1, d_model=16, num_heads=2, rounds=1, warmup=0,
                       memory=False, progress=False)
    impls = ("explicit", "fused", "combined", "torch")
    assert set(result.times) == {(impl, mode, n) for impl in impls
                                 for mode in ("fwd", "train") for n in (16, 32)}
    assert all(t > 0 for t in result.times.values())
    assert set(result.matmul_gflops) == {16, 32}
    assert all(0 < result.matmul_fraction(n) for n in (16, 32))
    table = format_table(result).splitlines()
    assert "combined ms" in table[0] and "torch ms" in table[0]
    assert "fused/combined" in table[6] and "fused/torch" in table[6]
    assert len(table) == (1 + 4) + (2 + 4) + (2 + 2)  # times, ratios, matmul rates
    assert "matmul GFLOP/s" in table[12]
    assert max(map(len, table)) <= 76  # fits the book's column


def test_combined_peer_has_the_same_weights_and_numbers():
    torch.manual_seed(1)
    m = MultiHeadAttention(32, 4).eval()
    peer = CombinedQKV.like(m)
    x = torch.randn(2, 9, 32)
    torch.testing.assert_close(peer(x), m(x)[0], atol=1e-5, rtol=1e-5)
    assert sum(p.numel() for p in peer.parameters()) == sum(p.numel() for p in m.parameters())


def test_attention_flops_counts_what_pytorch_counts():
    from torch.utils.flop_counter import FlopCounterMode

    m = MultiHeadAttention(64, 4).eval()
    x = torch.randn(3, 20, 64)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        m(x)  # explicit path: addmm for the projections, bmm for Q K^T and P V
    assert counter.get_total_flops() == attention_flops(3, 20, 64)


def test_peak_memory_sees_the_quadratic_weights():
    torch.manual_seed(0)
    batch, length, d_model, heads = 2, 256, 32, 4
    mha = MultiHeadAttention(d_model, heads)
    x = torch.randn(batch, length, d_model, requires_grad=True)
    weights_mib = batch * heads * length * length * 4 / 2**20  # one (B, H, L, L) float32
    explicit = peak_memory(lambda t: mha(t, need_weights=True)[0], x)
    fused = peak_memory(lambda t: mha(t, need_weights=False)[0], x)
    assert explicit >= weights_mib, (explicit, weights_mib)
    assert fused < weights_mib / 2, (fused, weights_mib)


def test_memory_only_run_and_ratio():
    result = benchmark([64], batch=1, d_model=16, num_heads=2, rounds=0, progress=False)
    assert result.times == {}
    assert result.memory["fused", 64] < result.memory["explicit", 64]
    assert "explicit MiB" in format_table(result)


def test_cli_prints_table_and_saves_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    plot = tmp_path / "bench.png"
    result = main(["--lengths", "16", "--batch", "1", "--d-model", "16", "--heads", "2",
                   "--rounds", "1", "--no-memory", "--plot", str(plot)])
    assert isinstance(result, Result)
    out = capsys.readouterr().out
    assert "fused/torch" in out and "plot saved" in out
    assert plot.stat().st_size > 1000
