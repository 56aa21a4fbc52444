"""The GPU record the book quotes (``mha_lib.gpu_record``): the script runs, and the
shipped record holds what the chapters read from it.

The record was measured on an H200; CI has no GPU, so here the script runs its fast
sections at tiny sizes on the CPU (``--smoke``), and the record is checked for the
relations the chapters state (each would fail on a record that contradicted them).
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from mha_lib.gpu_record import main, recorded

SECTIONS = ("env", "ceilings", "steps", "profile", "bench", "flex", "empty_rows",
            "overhead", "parts", "decode", "bench_compiled")


def test_the_script_runs_its_sections_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    fast = ["env", "ceilings", "steps", "empty_rows", "parts"]
    main(["--smoke", "--only", *fast, "--out", str(out)])
    record = json.loads(out.read_text())
    assert [s for s in fast if "error" in record[s]] == []
    assert record["steps"]["shape"] == [1, 2, 64, 8]
    assert set(record["parts"]["rows"][0]["host_idle_ms"]) == {
        "fused", "combined", "torch"}


def test_the_record_is_complete_and_from_a_gpu() -> None:
    record = recorded()
    assert [s for s in SECTIONS if s not in record] == []
    assert [s for s in SECTIONS if "error" in record[s]] == []
    assert record["env"]["gpu"] == record["env_second_run"]["gpu"] == "NVIDIA H200"
    assert [r for r in record["flex"]["rows"] if "error" in r] == []


def test_what_the_chapters_state_holds_in_the_record() -> None:
    record = recorded()
    bench = record["bench"]["bfloat16"]
    times = {(i, m, n): t for i, m, n, t in bench["times_ms"]}
    memory = {(i, n): v for i, n, v in bench["memory_mib"]}
    for n in bench["lengths"]:  # chapter 13: the fused path never holds L x L
        assert memory["fused", n] * 10 < memory["explicit", n]
        assert times["fused", "fwd", n] < times["explicit", "fwd", n]
    steps = record["steps"]  # chapter 13's roofline: the softmax is memory-bound
    assert steps["softmax"]["tflops"] < 5 < steps["scores Q K^T"]["tflops"]
    flex = {(r["case"], r["L"]): r for r in record["flex"]["rows"]}
    for (case, _n), row in flex.items():  # chapter 17: agreement within bfloat16
        assert row["max_diff"] <= (2**-4 if case.startswith("ALiBi") else 2**-7), case
    w, c = flex["window 256", 16384], flex["causal", 16384]  # work ~ L W, not L^2
    assert w["blocks_computed"] * 10 < c["blocks_computed"]
    assert w["flex_ms"] * 5 < c["flex_ms"]
    for row in record["parts"]["rows"]:  # chapter 13: the same GPU work, more host time
        host, gpu = row["host_idle_ms"], row["queued_ms"]
        assert host["fused"] > 1.3 * host["combined"]
        ratio = gpu["SDPA, fused's q k v"] / gpu["SDPA, combined's q k v"]
        assert 0.9 < ratio < 1.1
    decode = {r["module"]: r for r in record["decode"]["rows"]}  # chapter 14's note
    for kv in (32, 8, 1):  # cuDNN's plan per shape: a decoding step pays it each time
        row = decode[f"GQA H_kv={kv}"]
        assert row["default_ms"] > 10 * row["pinned_ms"]
        assert any("cudnn" in op for op in row["default_ops"])
    assert decode["MLA absorbed"]["pinned_ms"] < decode["MLA explicit"]["pinned_ms"]
    empty = {(r["dtype"], r["backend"]): r for r in record["empty_rows"]["sdpa"]}
    assert empty["float32", "MATH"]["zero"] and empty["bfloat16", "MATH"]["zero"]
    assert not empty["bfloat16", "default"]["zero"]  # chapter 11: cuDNN's rows
    assert empty["bfloat16", "default"]["nan"] == 0


def test_an_unknown_record_is_refused() -> None:
    with pytest.raises(ValueError, match="name must be one of"):
        recorded("a100")


def test_the_built_wheel_ships_the_record(tmp_path: Path) -> None:
    import shutil
    import subprocess
    import sys

    root = Path(__file__).parent.parent
    source = tmp_path / "src"  # a copy: setuptools writes build/ beside the sources
    shutil.copytree(root / "mha_lib", source / "mha_lib",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(source)], check=True, capture_output=True)
    wheel = next(tmp_path.glob("mha_lib-*.whl"))
    assert "mha_lib/data/h200.json" in zipfile.ZipFile(wheel).namelist()
