"""No stored output shows float rounding noise (``make test``; fast, no kernel).

nbval compares every stored output with a fresh run, on the reader's machine too, whose
CPU differs from the one that executed the notebooks (AVX-512, AVX2, Apple Silicon, no
vector kernels at all). The last bits of a float32 result change from one kernel set to
the next, so a stored output may print a difference at rounding level only as the
tolerance that was asserted ("agree within 1e-6"), never as the measured noise ("max
difference 5.96e-08"), and never a float with all its digits. Outputs of cells tagged
``nbval-ignore-output`` are not compared and are not scanned.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.front_matter import book_notebooks

# 5.96e-08, 1.2E-07, 3e-10: a measured difference at rounding level (exponent <= -6).
TINY = re.compile(r"(?<![\w.])\d(?:\.\d+)?[eE]-0*(?:[6-9]|[1-9]\d)\b")
# 0.0000000596: the same, written out.
TINY_DECIMAL = re.compile(r"(?<![\w.])0\.0{6,}[1-9]\d*")
# 0.30000001192092896: a float printed with all its digits.
FULL_DIGITS = re.compile(r"(?<![\w.])-?\d+\.\d{9,}\b")
# A number that is exactly a power of ten (1e-06, 1e-6, 1.0e-07) is a tolerance, not noise.
TOLERANCE = re.compile(r"^1(?:\.0*)?[eE]-0*\d+$")


def noise(text: str) -> list[str]:
    """The rounding-level numbers in ``text``."""
    found = [m.group(0) for m in TINY.finditer(text) if not TOLERANCE.match(m.group(0))]
    found += [m.group(0) for m in TINY_DECIMAL.finditer(text)]
    found += [m.group(0) for m in FULL_DIGITS.finditer(text)]
    return found


def _texts(cell: dict) -> list[str]:
    out = []
    for output in cell.get("outputs", []):
        out.append("".join(output.get("text", "")))
        data = output.get("data", {})
        for mime in ("text/plain", "text/markdown", "text/html"):
            out.append("".join(data.get(mime, "")))
    return out


def scan(path: Path) -> list[str]:
    """``"cell N: <numbers>"`` for every compared cell of the notebook that prints noise."""
    problems = []
    for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
        if cell["cell_type"] != "code":
            continue
        if "nbval-ignore-output" in cell.get("metadata", {}).get("tags", []):
            continue
        found = [n for text in _texts(cell) for n in noise(text)]
        if found:
            problems.append(f"cell {i}: {', '.join(sorted(set(found))[:4])}")
    return problems


@pytest.mark.parametrize("path", book_notebooks(), ids=lambda p: p.name)
def test_no_stored_output_prints_rounding_noise(path: Path) -> None:
    problems = scan(path)
    assert not problems, (
        f"{path.name} prints numbers another CPU computes differently (print the tolerance "
        f"you asserted, or round): " + "; ".join(problems))


@pytest.mark.parametrize("text", [
    "max difference 5.96e-08", "diff: 1.19E-07", "3e-10", "tensor(2.3842e-07)",
    "0.00000006", "loss 0.30000001192092896", "-1.2345678901"])
def test_the_scan_finds_planted_noise(text: str) -> None:
    assert noise(text), text


@pytest.mark.parametrize("text", [
    "agree within 1e-6", "atol=1e-06", "tolerance 1.0e-07", "0.0039", "lr 3e-4",
    "2.5e-05 s", "tensor([0.1235, 0.5000])", "1,234,567.5", "ids 123456789", "v0.2.0"])
def test_the_scan_leaves_legitimate_numbers(text: str) -> None:
    assert not noise(text), text


def test_the_scan_names_the_notebook_cell(tmp_path: Path) -> None:
    nb = {"cells": [
        {"cell_type": "markdown", "source": "max difference 5.96e-08", "metadata": {}},
        {"cell_type": "code", "metadata": {}, "outputs": [
            {"output_type": "stream", "name": "stdout", "text": ["ok\n"]}]},
        {"cell_type": "code", "metadata": {}, "outputs": [
            {"output_type": "stream", "name": "stdout", "text": ["max diff 6.0e-08\n"]}]},
        {"cell_type": "code", "metadata": {"tags": ["nbval-ignore-output"]}, "outputs": [
            {"output_type": "stream", "name": "stdout", "text": ["3.1e-09\n"]}]},
    ]}
    path = tmp_path / "planted.ipynb"
    path.write_text(json.dumps(nb), encoding="utf-8")
    assert scan(path) == ["cell 2: 6.0e-08"]
