"""The introduction's opening example (book/intro.md, not a notebook) prints what its
`text` block after the code says: the same seeded weights, rounded to 2 decimals."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import torch

INTRO = Path(__file__).resolve().parent.parent / "book" / "intro.md"


def test_intro_example_prints_what_the_page_shows() -> None:
    text = INTRO.read_text(encoding="utf-8")
    found = re.search(r"```python\n(.*?)```\n\n```text\n(.*?)```", text, re.S)
    assert found, "book/intro.md: no ```python block followed by a ```text block"
    code, shown = found.groups()
    printed = io.StringIO()
    options = torch._tensor_str.PRINT_OPTS.precision
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(code, str(INTRO), "exec"), {})  # noqa: S102
    finally:
        torch.set_printoptions(precision=options)
    assert printed.getvalue() == shown
