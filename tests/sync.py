"""Keep the book's teaching copies and the library in sync.

A chapter that derives a library object for teaching writes it in a code cell whose
first line names it::

    # mha_lib: tokenize

The cell's ``def tokenize`` (or ``class``) must then be, in logic, the library's own
``mha_lib.tokenize``. "In logic" means the two syntax trees are equal once we drop what
does not change behaviour: docstrings, comments, formatting, type annotations, and the
input checks (``check_*(...)`` calls and ``if ...: raise`` guards directly in the
body), which a chapter may leave out to keep the idea in view. Anything else (a
constant, an operator, an axis, a statement) is drift, and :func:`drift` reports it.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
from dataclasses import dataclass
from pathlib import Path

MARKER = re.compile(r"^#\s*mha_lib:\s*(?P<names>[\w.]+(?:\s*,\s*[\w.]+)*)\s*$")
BOOK = Path(__file__).resolve().parents[1] / "book"


@dataclass(frozen=True)
class TeachingCopy:
    notebook: Path
    cell: int
    name: str  # the library object, e.g. "tokenize" or "mha_lib.heads.split_heads"
    source: str  # the whole cell

    def __str__(self) -> str:
        return f"{self.notebook.name} cell {self.cell}: {self.name}"


def code_cells(notebook: Path) -> list[tuple[int, str]]:
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return [(i, "".join(c["source"])) for i, c in enumerate(cells) if c["cell_type"] == "code"]


def teaching_copies(book: Path = BOOK) -> list[TeachingCopy]:
    copies = []
    for notebook in sorted(book.rglob("*.ipynb")):
        if ".ipynb_checkpoints" in notebook.parts:
            continue
        for i, source in code_cells(notebook):
            match = MARKER.match(source.split("\n", 1)[0])
            if match:
                for name in re.split(r"\s*,\s*", match["names"]):
                    copies.append(TeachingCopy(notebook, i, name, source))
    return copies


def library_object(name: str) -> object:
    module, _, attr = name.rpartition(".")
    return getattr(importlib.import_module(module or "mha_lib"), attr)


def find_definition(tree: ast.AST, name: str) -> ast.FunctionDef | ast.ClassDef | None:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                and node.name == name:
            return node
    return None


class _Normalize(ast.NodeTransformer):
    """Drop what does not change behaviour: docstrings, annotations, input checks."""

    def _body(self, body: list[ast.stmt]) -> list[ast.stmt]:
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            body = body[1:]  # docstring
        return [stmt for stmt in body if not _is_input_check(stmt)] or [ast.Pass()]

    def visit_FunctionDef(self, node):  # noqa: N802 (ast visitor API)
        node.returns = None
        node.body = self._body(node.body)
        return self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):  # noqa: N802
        node.body = self._body(node.body)
        return self.generic_visit(node)

    def visit_arg(self, node):
        node.annotation = None
        return node

    def visit_AnnAssign(self, node):  # noqa: N802
        if node.value is None:
            return None
        return ast.copy_location(ast.Assign(targets=[node.target], value=node.value), node)


def _is_input_check(stmt: ast.stmt) -> bool:
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        func = stmt.value.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        return name.startswith(("check_", "_check"))
    if isinstance(stmt, ast.If) and not stmt.orelse:
        return all(isinstance(s, ast.Raise) for s in stmt.body)
    return False


def normalized(node: ast.AST) -> str:
    node = _Normalize().visit(ast.parse(ast.unparse(node)))  # a fresh copy
    return ast.dump(node, annotate_fields=False)


def drift(copy_source: str, name: str) -> str | None:
    """None when the cell's definition of ``name`` matches the library's, else why not."""
    short = name.rpartition(".")[2]
    cell = find_definition(ast.parse(copy_source), short)
    if cell is None:
        return f"the cell defines no function or class named {short!r}"
    library_tree = ast.parse(inspect.getsource(library_object(name)).strip("\n"))
    library = find_definition(library_tree, short)
    if normalized(cell) == normalized(library):
        return None
    return ("the teaching copy differs from the library in logic:\n--- library\n"
            + ast.unparse(_Normalize().visit(ast.parse(ast.unparse(library))))
            + "\n--- chapter\n"
            + ast.unparse(_Normalize().visit(ast.parse(ast.unparse(cell)))))
