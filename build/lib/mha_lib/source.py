"""Show the library's own source in a notebook, wherever it is opened.

The book shows finished code by displaying ``mha_lib``'s source as a
cell's output, so what a reader sees is what the library runs (the
notebook tests compare the stored output with the source on every run).
The output is Markdown, a fenced Python block, which the HTML book,
JupyterLab, Colab and ``nbconvert`` all highlight; the parts a chapter
does not discuss are folded in a ``<details>`` block, one click away.
Imported by the notebooks only (like :mod:`mha_lib.viz`).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass

__all__ = ["Source", "show_source"]


@dataclass(frozen=True)
class Source:
    """Source code to display: ``shown`` in full, ``folded`` behind
    ``summary``.

    Notebooks render its Markdown form (``_repr_markdown_``); ``repr`` is
    the plain text of both parts. :func:`show_source` makes one.

    Args:
        shown: The code shown in full.
        folded: The code folded away; ``""``: none.
        summary: The line that stands for the folded code.
    """

    shown: str
    folded: str = ""
    summary: str = ""

    def __repr__(self) -> str:
        if not self.folded:
            return self.shown
        return f"{self.shown}\n\n# {self.summary}\n{self.folded}"

    def _repr_markdown_(self) -> str:
        text = f"```python\n{self.shown}\n```"
        if self.folded:
            text += (f"\n\n<details><summary>{self.summary}</summary>\n\n"
                     f"```python\n{self.folded}\n```\n\n</details>")
        return text


def _docstring_lines(tree: ast.AST) -> set[int]:
    """0-based line numbers of every docstring in ``tree``."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                             ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr)
                    and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                lines.update(range(first.lineno - 1, first.end_lineno))
    return lines


def _start(node: ast.stmt) -> int:
    """0-based first line of ``node``, decorators included."""
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno] + [d.lineno for d in decorators]) - 1


def _name(node: ast.stmt) -> str:
    """The name a class-body statement defines ("" if none)."""
    if hasattr(node, "name"):
        return node.name
    targets = (getattr(node, "targets", None)
               or [getattr(node, "target", None)])
    return next((t.id for t in targets if isinstance(t, ast.Name)), "")


def _join(lines: list[str], keep: list[int]) -> str:
    text = "\n".join(lines[i] for i in keep).rstrip()
    while "\n\n\n" in text:  # a removed docstring can leave two blank lines
        text = text.replace("\n\n\n", "\n\n")
    return text


def show_source(obj: object, *members: str,
                docstrings: bool = False) -> Source:
    """The source of a function, method or class of ``mha_lib``, ready to
    display in a notebook.

    Args:
        obj: What to show.
        *members: For a class, the methods (or other names its body
            defines) to show, in the class's order; the rest of the class
            is folded. None: the whole object.
        docstrings: Keep the docstrings (left out by default: the API page
            has them, and the listing stays short).

    Raises:
        TypeError: If ``obj`` has no Python source.
        ValueError: If a member is not defined in the class body, or
            ``members`` is given for something that is not a class.
    """
    try:
        source = textwrap.dedent(inspect.getsource(obj))
    except (TypeError, OSError) as error:
        raise TypeError(f"obj: expected a function, method or class with "
                        f"Python source, got {obj!r}") from error
    tree = ast.parse(source)
    lines = source.split("\n")
    drop = set() if docstrings else _docstring_lines(tree)
    if not members:
        keep = [i for i in range(len(lines)) if i not in drop]
        return Source(_join(lines, keep))
    cls = tree.body[0]
    if not isinstance(cls, ast.ClassDef):
        raise ValueError(f"members: only a class has members, got "
                         f"{members!r} for {obj!r}")
    body = [node for node in cls.body if _start(node) not in drop]
    missing = [m for m in members if m not in {_name(n) for n in body}]
    if missing:
        raise ValueError(f"members: expected names defined in {cls.name}'s "
                         f"body, got {missing!r}")
    header = [i for i in range(_start(cls), cls.body[0].lineno - 1)
              if i not in drop]
    shown, folded, rest = list(header), list(header), []
    for node in body:
        span = [i for i in range(_start(node), node.end_lineno)
                if i not in drop]
        target = shown if _name(node) in members else folded
        if target is folded and _name(node) not in ("", *rest):
            rest.append(_name(node))
        if len(target) > len(header):
            target.append(-1)  # a blank line between members
        target.extend(span)
    lines.append("")  # index -1: the blank line
    if len(folded) == len(header):
        return Source(_join(lines, shown))
    folded_text = _join(lines, folded)
    count = folded_text.count("\n") + 1 - len(header)
    summary = (f"The rest of {cls.name} ({count} lines): "
               + ", ".join(rest))
    return Source(_join(lines, shown), folded_text, summary)
