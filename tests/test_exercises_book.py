"""Every exercise's own solution in the book is accepted by its checker.

The solution code is read from the notebooks: each code cell that calls a
``check_*`` function is run up to (and including) its first statement that
calls one, after the statements of earlier cells that it needs (found by
the names it uses, so no training loop or plot is re-run). The first
verdict it prints must start with ``Correct``, and every verdict the
checkers return on the way is recorded.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import io
import json
import re
import sys
import types
from pathlib import Path

import pytest

BOOK = Path(__file__).resolve().parent.parent / "book"
NOTEBOOKS = sorted(BOOK.glob("[0-9][0-9]_*.ipynb"))
CHECK = re.compile(r"\bcheck_\w+\s*\(")


def _code_cells(path: Path) -> list[str]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    sources = []
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        # IPython magics and shell lines are not Python
        lines = [line for line in source.splitlines()
                 if not line.lstrip().startswith(("%", "!"))]
        sources.append("\n".join(lines))
    return sources


def _parse(source: str) -> list[ast.stmt]:
    try:
        return ast.parse(source).body
    except SyntaxError:
        return []


def _bound(node: ast.stmt) -> set[str]:
    """Names a top-level statement binds."""
    names = set()
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                         ast.ClassDef)):
        names.add(node.name)
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
        for alias in node.names:
            names.add((alias.asname or alias.name).split(".")[0])
    else:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                names.add(sub.id)
    return names


def _names(node: ast.AST) -> tuple[set[str], set[str]]:
    """(names read, names bound) by ``node`` in the scope it sits in; a
    function or a comprehension reads only what its own scope does not
    bind."""
    if isinstance(node, ast.Name):
        return ({node.id}, set()) if isinstance(node.ctx, ast.Load) \
            else (set(), {node.id})
    scoped = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda,
              ast.ClassDef, ast.ListComp, ast.SetComp, ast.DictComp,
              ast.GeneratorExp)
    loads: set[str] = set()
    stores: set[str] = set()
    for child in ast.iter_child_nodes(node):
        read, bound = _names(child)
        loads |= read
        stores |= bound
    if isinstance(node, ast.arg):
        return set(), {node.arg}
    if isinstance(node, scoped):
        name = getattr(node, "name", None)
        return loads - stores, {name} if name else set()
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        return set(), set()
    return loads, stores


def _free(nodes: list[ast.stmt]) -> set[str]:
    """Names the statements read before or without binding them."""
    loads: set[str] = set()
    stores: set[str] = set()
    for node in nodes:
        read, bound = _names(node)
        loads |= read - stores
        stores |= bound
    return loads - set(dir(builtins))


def _solutions(path: Path) -> list[tuple[str, list[ast.stmt], list]]:
    """(id, the context statements, the solution's statements) for every
    checker that a cell of ``path`` calls; the last such cell is the
    solution (an exercise's own text comes before it)."""
    earlier: list[ast.stmt] = []
    found: dict[str, tuple[list, list]] = {}
    for source in _code_cells(path):
        body = _parse(source)
        if CHECK.search(source) and body:
            prefix, kept = [], None
            for node in body:
                prefix.append(node)
                text = ast.unparse(node)
                if kept is None and CHECK.search(text):
                    if not isinstance(node, ast.Assign):
                        break
                    kept = _bound(node)  # printed by a later statement
                elif kept and text.startswith("print(") \
                        and kept & _free([node]):
                    break
            needed = _free(prefix)
            context: list[ast.stmt] = []
            for node in reversed(earlier):
                names = _bound(node) & needed
                if names:
                    context.insert(0, node)
                    needed = (needed - _bound(node)) | _free([node])
            name = CHECK.search(ast.unparse(ast.Module(prefix, []))).group(0)
            found[f"{path.name[:2]}-{name.rstrip('( ')}"] = (context, prefix)
        earlier += body
    return [(name, *case) for name, case in found.items()]


CASES = [case for path in NOTEBOOKS for case in _solutions(path)]


def test_every_checker_has_a_solution_in_the_book():
    import mha_lib.exercises as exercises

    checkers = {n for n in exercises.__all__ if n.startswith("check_")}
    assert {case[0][3:] for case in CASES} == checkers
    assert {case[0][:2] for case in CASES} == {p.name[:2] for p in NOTEBOOKS}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_the_books_solution_is_correct(case, monkeypatch):
    import mha_lib.exercises as exercises

    _, context, prefix = case
    # The solution runs in a real module, as a notebook's code runs in
    # __main__: torch.compile's tracer (which eager flex_attention uses
    # on a score_mod) looks the function's globals up through it.
    module = types.ModuleType("__solution__")
    monkeypatch.setitem(sys.modules, "__solution__", module)
    namespace: dict = module.__dict__
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(ast.Module(context, []), "<context>", "exec"),
             namespace)
    returned = []

    def recording(checker):
        def wrapper(*args, **kwargs):
            verdict = checker(*args, **kwargs)
            returned.append(verdict)
            return verdict
        return wrapper

    for name in exercises.__all__:
        if name.startswith("check_") and name in namespace:
            namespace[name] = recording(getattr(exercises, name))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(ast.Module(prefix, []), "<solution>", "exec"),
             namespace)
    assert returned, "no checker was called"
    assert returned[0], repr(returned[0])
    verdicts = [line for line in printed.getvalue().splitlines()
                if re.match(r"\s*(\S+: )?(Correct|Not yet):", line)]
    assert verdicts and "Correct:" in verdicts[0], printed.getvalue()
