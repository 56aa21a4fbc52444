"""The book's teaching copies of library code must match the library (see tests/sync.py)."""

from __future__ import annotations

import ast
import inspect
import re

import pytest

import mha_lib
from tests.sync import BOOK, code_cells, drift, find_definition, library_object, teaching_copies

COPIES = teaching_copies()


def test_the_book_has_teaching_copies():
    # If markers stop being found (renamed, reformatted), every test below would pass
    # on nothing: chapter 1 alone has three.
    assert len(COPIES) >= 3, f"found only {[str(c) for c in COPIES]}"


@pytest.mark.parametrize("copy_", COPIES, ids=str)
def test_teaching_copy_matches_library(copy_):
    problem = drift(copy_.source, copy_.name)
    assert problem is None, f"{copy_}: {problem}"


# A cell whose first line is "# published: <where>" shows another project's code as it
# was published (d2l's class of the same name, say): not a copy of the library's.
PUBLISHED = re.compile(r"#\s*published:\s*\S")


def test_every_copy_of_a_library_name_is_marked():
    """A chapter that defines a function or class with a public library name must mark
    the cell, or it would be an unchecked second copy."""
    public = set(mha_lib.__all__)
    marked = {(c.notebook, c.cell) for c in COPIES}
    unmarked = []
    for notebook in sorted(BOOK.rglob("*.ipynb")):
        for i, source in code_cells(notebook):
            try:
                tree = ast.parse(source)
            except SyntaxError:  # IPython magics; such cells define no library code
                continue
            names = {n.name for n in ast.iter_child_nodes(tree)
                     if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
            if PUBLISHED.match(source):  # another project's code, shown as published
                continue
            if names & public and (notebook, i) not in marked:
                unmarked.append(f"{notebook.name} cell {i}: {sorted(names & public)}")
    assert not unmarked, f"unmarked copies of library code: {unmarked}"


# --- the sync test must catch drift, and only drift ---------------------------------

class _ChangeOneToken(ast.NodeTransformer):
    """A realistic one-token drift: the first constant (not a docstring) or, in code
    without constants, the first binary operator."""

    SWAP = {ast.Add: ast.Sub, ast.Sub: ast.BitOr, ast.Mult: ast.Div, ast.Div: ast.Mult,
            ast.MatMult: ast.Mult, ast.BitOr: ast.BitAnd, ast.BitAnd: ast.BitOr}

    def __init__(self, kind):
        self.kind, self.done = kind, False

    def visit_Constant(self, node):  # noqa: N802 (ast visitor API)
        if self.done or self.kind != "constant" or isinstance(node.value, (bool, type(None))):
            return node
        if isinstance(node.value, str) and "\n" in node.value:
            return node
        self.done = True
        value = node.value + 1 if isinstance(node.value, (int, float)) else node.value + "x"
        return ast.copy_location(ast.Constant(value), node)

    def visit_BinOp(self, node):  # noqa: N802
        self.generic_visit(node)
        if not self.done and self.kind == "operator" and type(node.op) in self.SWAP:
            self.done = True
            node.op = self.SWAP[type(node.op)]()
        return node


def _mutate(source: str, name: str, how: str) -> str:
    tree = ast.parse(source)
    target = find_definition(tree, name.rpartition(".")[2])
    if how == "token":
        for kind in ("constant", "operator"):
            mutator = _ChangeOneToken(kind)
            target.body = [mutator.visit(stmt) for stmt in target.body]
            if mutator.done:
                break
        assert mutator.done, "no constant or operator to change"
    elif how == "statement":
        target.body.insert(len(target.body) - 1, ast.parse("_drift = None").body[0])
    elif how == "cosmetic":  # not drift: other comments and formatting, no annotations
        for node in ast.walk(target):
            if isinstance(node, ast.arg):
                node.annotation = None
            if isinstance(node, ast.FunctionDef):
                node.returns = None
        return "# a comment\n" + ast.unparse(tree)
    return ast.unparse(tree)


@pytest.mark.parametrize("copy_", COPIES, ids=str)
@pytest.mark.parametrize("how", ["token", "statement"])
def test_sync_catches_altered_copy(copy_, how):
    altered = _mutate(copy_.source, copy_.name, how)
    assert altered != copy_.source
    assert drift(altered, copy_.name) is not None, f"{how} change to {copy_} went unnoticed"


@pytest.mark.parametrize("copy_", COPIES, ids=str)
def test_sync_ignores_cosmetic_changes(copy_):
    assert drift(_mutate(copy_.source, copy_.name, "cosmetic"), copy_.name) is None


def test_sync_catches_a_wrong_softmax_axis():
    """The drift readers would actually make: the library's softmax over the wrong axis."""
    source = inspect.getsource(library_object("masked_softmax"))
    assert drift(source, "masked_softmax") is None
    altered = source.replace("torch.softmax(x, dim=-1)", "torch.softmax(x, dim=-2)")
    assert altered != source
    assert drift(altered, "masked_softmax") is not None
