"""mha_lib.source.show_source: the library's own code, as the chapters display it."""

from __future__ import annotations

import ast
import inspect

import pytest

import mha_lib
from mha_lib.source import Source, show_source


def test_a_function_is_shown_whole_without_docstrings() -> None:
    shown = show_source(mha_lib.masked_softmax)
    assert shown.shown.startswith("def masked_softmax(") and not shown.folded
    assert '"""' not in shown.shown and "\n\n\n" not in shown.shown
    ast.parse(shown.shown)
    # every code line of the function is there, in order
    code = [line for line in inspect.getsource(mha_lib.masked_softmax).splitlines()
            if line.strip() and line in shown.shown]
    assert code == [line for line in shown.shown.splitlines() if line.strip()]


def test_docstrings_can_be_kept() -> None:
    shown = show_source(mha_lib.masked_softmax, docstrings=True)
    assert shown.shown == inspect.getsource(mha_lib.masked_softmax).rstrip()


def test_members_are_shown_and_the_rest_folded() -> None:
    shown = show_source(mha_lib.MultiHeadAttention, "__init__", "forward")
    assert shown.shown.startswith("class MultiHeadAttention(nn.Module):\n    def __init__(")
    assert "    def forward(" in shown.shown and "def extra_repr" not in shown.shown
    assert "def extra_repr" in shown.folded and "def __init__" not in shown.folded
    assert shown.summary.startswith("The rest of MultiHeadAttention (")
    names = shown.summary.split(": ", 1)[1].split(", ")
    assert "extra_repr" in names and len(names) == len(set(names))
    ast.parse(shown.shown)
    ast.parse(shown.folded)


def test_markdown_is_a_python_block_and_a_fold() -> None:
    text = show_source(mha_lib.KVCache, "update")._repr_markdown_()
    assert text.startswith("```python\nclass KVCache:\n")
    assert "\n\n<details><summary>The rest of KVCache (" in text
    assert text.endswith("\n```\n\n</details>")
    assert repr(Source("x = 1")) == "x = 1"
    assert Source("x = 1")._repr_markdown_() == "```python\nx = 1\n```"


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match=r"members: expected names defined in "
                                         r"MultiHeadAttention's body, got \['nope'\]"):
        show_source(mha_lib.MultiHeadAttention, "nope")
    with pytest.raises(ValueError, match="members: only a class has members"):
        show_source(mha_lib.causal_mask, "x")
    with pytest.raises(TypeError, match="obj: expected a function, method or class"):
        show_source(len)
