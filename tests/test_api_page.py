"""Appendix B documents every name of mha_lib that a notebook uses.

The notebooks are read as they are when the test runs (other pages change in parallel):
every ``import mha_lib...`` / ``from mha_lib... import ...`` and every attribute chain on
them (``mha_lib.viz.heatmaps``, ``bench.benchmark``) must resolve to an object that an
autodoc directive of ``book/appendix_b_api.md`` documents; and every method or property
of a class the notebooks reach (a class they use, or one that a function they use
returns, e.g. ``KVCache.layer`` -> ``LayerCache``) that a notebook accesses by name
(``cache.reorder(...)``) must be documented as a member of that class. The page's
hand-written ``py:data`` entries must state the library's values.

This reads the page's source, so it needs no book build; ``tests/test_book.py`` checks
the rendered page (signatures, parameter descriptions, chapter links).
"""

from __future__ import annotations

import ast
import doctest
import importlib
import inspect
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
BOOK = REPO / "book"
API_PAGE = BOOK / "appendix_b_api.md"
NOTEBOOKS = sorted(BOOK.glob("*.ipynb"))

# `.. autoclass:: mha_lib.KVCache` and its option lines (`:members: a, b`).
DIRECTIVE_RE = re.compile(
    r"^\.\. (?P<kind>auto\w+|py:\w+):: (?P<target>[\w.:]+)[^\n]*\n"
    r"(?P<options>(?:[ \t]+:[\w-]+:[^\n]*\n)*)", re.MULTILINE)
OPTION_RE = re.compile(r"^[ \t]+:(?P<name>[\w-]+):[ \t]*(?P<value>[^\n]*)$", re.MULTILINE)
# Names every object has, and the methods nn.Module defines for all of its subclasses.
INHERITED = set(dir(object)) | set(dir(torch.nn.Module))


# --- what the page documents ----------------------------------------------------------------

def resolve(dotted: str) -> object:
    """The object a dotted name names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(dotted)


def public_members(cls: type) -> list[str]:
    """Methods, properties and fields with defaults that ``cls`` itself defines."""
    return [name for name in vars(cls) if not name.startswith("_") and name not in INHERITED]


@dataclass
class Documented:
    """What a page documents: functions and classes (by identity, so that a name
    re-exported elsewhere counts), data (by dotted name), class members."""

    objects: list[object] = field(default_factory=list)
    names: set[str] = field(default_factory=set)
    members: set[tuple[int, str]] = field(default_factory=set)
    values: dict[str, str] = field(default_factory=dict)  # py:data name -> :value:

    def add(self, dotted: str, obj: object) -> None:
        self.names.add(dotted)
        self.objects.append(obj)

    def has(self, obj: object, dotted: str = "") -> bool:
        if callable(obj) or isinstance(obj, types.ModuleType):
            return any(obj is known for known in self.objects)
        return dotted in self.names  # an int or a list: identity would mean nothing

    def has_member(self, cls: type, name: str) -> bool:
        return (id(cls), name) in self.members


def documented(text: str) -> Documented:
    """Parse the autodoc (and py:) directives of a page's source."""
    out = Documented()
    for match in DIRECTIVE_RE.finditer(text):
        # `mha_lib.cache::LayerCache`: autodoc's explicit module, same object
        kind, target = match["kind"], match["target"].replace("::", ".")
        options = {m["name"]: m["value"].strip() for m in OPTION_RE.finditer(match["options"])}
        if kind.startswith("py:"):  # hand-written: `.. py:data:: NAME` + `:module: m`
            dotted = f"{options['module']}.{target}" if "module" in options else target
            out.add(dotted, resolve(dotted))
            if "value" in options:
                out.values[dotted] = options["value"]
            continue
        obj = resolve(target)
        out.add(target, obj)
        if kind == "automodule":
            if "members" in options:
                names = getattr(obj, "__all__", None) or [
                    n for n, v in vars(obj).items()
                    if not n.startswith("_") and getattr(v, "__module__", None) == target]
                for name in names:
                    out.add(f"{target}.{name}", getattr(obj, name))
            continue
        if kind == "autoclass" and "members" in options:
            listed = [n.strip() for n in options["members"].split(",") if n.strip()]
            if not listed:  # `:members:` alone: the documented ones, or all with undoc
                listed = [n for n in public_members(obj)
                          if "undoc-members" in options or inspect.getdoc(getattr(obj, n))]
            out.members |= {(id(obj), n) for n in listed}
        if kind in ("automethod", "autoattribute", "autoproperty"):
            owner, name = target.rsplit(".", 1)
            out.members.add((id(resolve(owner)), name))
    return out


# --- what a notebook uses --------------------------------------------------------------------

@dataclass
class Uses:
    names: dict[str, int] = field(default_factory=dict)  # dotted name -> first cell
    attributes: set[str] = field(default_factory=set)  # every `.name` accessed


def code_of(cell: nbformat.NotebookNode) -> str:
    """A code cell's source as Python: IPython magics and shell lines dropped."""
    return "\n".join(line for line in cell.source.splitlines()
                     if not line.lstrip().startswith(("%", "!")))


def notebook_uses(nb: nbformat.NotebookNode) -> Uses:
    """The mha_lib names a notebook's code uses, resolved through its imports."""
    uses, aliases = Uses(), {}  # local name -> dotted mha_lib name
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse(code_of(cell))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "mha_lib":
                        local = alias.asname or alias.name.split(".")[0]
                        aliases[local] = alias.name if alias.asname else "mha_lib"
                        uses.names.setdefault(alias.name, index)
            elif isinstance(node, ast.ImportFrom) \
                    and (node.module or "").split(".")[0] == "mha_lib":
                for alias in node.names:
                    dotted = f"{node.module}.{alias.name}"
                    aliases[alias.asname or alias.name] = dotted
                    uses.names.setdefault(dotted, index)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                uses.attributes.add(node.attr)
                chain, base = [], node
                while isinstance(base, ast.Attribute):
                    chain.append(base.attr)
                    base = base.value
                if isinstance(base, ast.Name) and base.id in aliases:
                    dotted = ".".join([aliases[base.id], *reversed(chain)])
                    uses.names.setdefault(dotted, index)
    return uses


def reached_classes(objects: list[object]) -> list[type]:
    """The mha_lib classes among ``objects``, and those their functions and methods
    return (by annotation), and so on."""
    seen: list[type] = []
    todo = list(objects)
    while todo:
        obj = todo.pop()
        if isinstance(obj, type):
            if not obj.__module__.startswith("mha_lib") or obj in seen:
                continue
            seen.append(obj)
            todo += [getattr(obj, n) for n in public_members(obj)]
            continue
        func = obj.fget if isinstance(obj, property) else obj
        if not callable(func) or isinstance(func, types.ModuleType):
            continue
        try:
            hints = typing.get_type_hints(func)
        except Exception:  # an annotation that does not evaluate: nothing to follow
            continue
        ret = hints.get("return")
        todo += [t for t in (ret, *typing.get_args(ret)) if isinstance(t, type)]
    return seen


def undocumented(uses: Uses, page: Documented) -> list[str]:
    """The names ``uses`` needs that ``page`` does not document, with where they are."""
    missing, used_objects = [], []
    for dotted, cell in sorted(uses.names.items()):
        try:
            obj = resolve(dotted)
        except (ImportError, AttributeError):
            if "." in dotted:  # `mha_lib.X.attr` where attr is an instance's: check X
                owner, name = dotted.rsplit(".", 1)
                try:
                    cls = resolve(owner)
                except (ImportError, AttributeError):
                    missing.append(f"{dotted} (cell {cell}: no such name in mha_lib)")
                    continue
                if isinstance(cls, type) and not page.has_member(cls, name) \
                        and name in public_members(cls):
                    missing.append(f"{owner}.{name} (cell {cell})")
            continue
        if isinstance(obj, types.ModuleType):
            continue  # a module is documented through its names
        owner, _, name = dotted.rpartition(".")
        try:
            parent = resolve(owner)
        except (ImportError, AttributeError):
            parent = None
        if isinstance(parent, type) and name == "__init__" and page.has(parent):
            used_objects.append(parent)  # the class's entry documents its constructor
            continue
        if isinstance(parent, type):  # `mha_lib.KVCache.reorder`: a member
            if not page.has_member(parent, name) and not page.has(obj):
                missing.append(f"{dotted} (cell {cell})")
            used_objects.append(parent)
            continue
        used_objects.append(obj)
        if not page.has(obj, dotted):
            missing.append(f"{dotted} (cell {cell})")
    for cls in reached_classes(used_objects):
        for name in public_members(cls):
            dotted = f"{cls.__module__}.{cls.__qualname__}.{name}"
            if name in uses.attributes and not page.has_member(cls, name) \
                    and not any(m.startswith(f"{dotted} ") for m in missing):
                missing.append(f"{dotted} (a member of {cls.__name__} that the notebook "
                               "accesses)")
    return missing


def _read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


@pytest.fixture(scope="module")
def page() -> Documented:
    return documented(API_PAGE.read_text(encoding="utf-8"))


# --- the tests -------------------------------------------------------------------------------

def test_the_page_documents_what_it_should(page: Documented) -> None:
    """The parser sees the page: the main classes, their members, the checkers."""
    import mha_lib
    from mha_lib.exercises import check_attention
    assert page.has(mha_lib.MultiHeadAttention) and page.has(check_attention)
    assert page.has_member(mha_lib.KVCache, "reorder")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_mha_lib_name_a_notebook_uses_is_on_the_api_page(
        path: Path, page: Documented) -> None:
    missing = undocumented(notebook_uses(_read(path)), page)
    assert not missing, (
        f"{path.name} uses names of mha_lib that {API_PAGE.relative_to(REPO)} does not "
        f"document (add an autodoc directive, or a member to `:members:`): {missing}")


def test_a_planted_undocumented_name_is_found(page: Documented) -> None:
    """A real notebook plus one cell that uses names the page lacks: each is reported."""
    nb = _read(BOOK / "14_kv_cache_and_gqa.ipynb")
    assert not undocumented(notebook_uses(nb), page)
    nb.cells.append(nbformat.v4.new_code_cell(
        "from mha_lib.mha import check_heads\n"
        "import mha_lib.cache as kv\n"
        "check_heads(8, 2, 0.0)\n"
        "print(kv.writer_id(model), mha_lib.mha.with_causal)\n"))
    missing = " ".join(undocumented(notebook_uses(nb), page))
    for name in ("mha_lib.mha.check_heads", "mha_lib.cache.writer_id",
                 "mha_lib.mha.with_causal"):
        assert name in missing, f"{name} not reported: {missing}"


def test_a_planted_undocumented_member_is_found() -> None:
    """``cache.reorder(...)`` on a page that lists KVCache without ``reorder``."""
    page = documented(
        ".. autoclass:: mha_lib.KVCache\n   :members: update, layer, kept\n\n"
        ".. autoclass:: mha_lib.cache.LayerCache\n   :members:\n   :undoc-members:\n")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "from mha_lib import KVCache\ncache = KVCache()\ncache.reorder(order)\n"
        "cache.layer(0).kept\n")])
    missing = undocumented(notebook_uses(nb), page)
    assert missing == ["mha_lib.cache.KVCache.reorder (a member of KVCache that the "
                       "notebook accesses)"], missing


def test_the_page_states_the_librarys_version() -> None:
    import mha_lib
    text = API_PAGE.read_text(encoding="utf-8")
    assert f"`mha_lib` {mha_lib.__version__} (`mha_lib.__version__`)" in text, (
        f"{API_PAGE.name} does not state mha_lib {mha_lib.__version__}")


def checker_table_gaps(text: str) -> list[str]:
    """The chapters' checkers (``mha_lib.exercises.chapterNN.check_*``) missing from the
    page's table of checkers, where each chapter's row links its checkers."""
    from mha_lib import exercises

    return [f"{fn.__module__}.{name}" for name in exercises.__all__
            if name.startswith("check_") and callable(fn := getattr(exercises, name))
            and f"{{py:func}}`~{fn.__module__}.{name}`" not in text]


def test_the_checker_table_lists_every_checker() -> None:
    text = API_PAGE.read_text(encoding="utf-8")
    assert not checker_table_gaps(text), checker_table_gaps(text)
    planted = text.replace("{py:func}`~mha_lib.exercises.chapter03.check_ahead_matrix`", "")
    assert checker_table_gaps(planted) == ["mha_lib.exercises.chapter03.check_ahead_matrix"]


def test_hand_written_values_are_the_librarys(page: Documented) -> None:
    assert page.values, "the page's py:data entries state no :value:"
    for dotted, value in page.values.items():
        assert repr(resolve(dotted)) == value, f"{dotted}: the page says {value}"


def _examples() -> list[doctest.DocTest]:
    """The ``Example:`` sections (doctests) of every docstring in mha_lib's public modules
    (the private ones, which the API page does not show, are left unimported: one of them
    loads PyTorch's compiler, seconds in every test worker)."""
    import pkgutil

    import mha_lib
    finder = doctest.DocTestFinder(exclude_empty=True)
    tests = []
    for info in pkgutil.iter_modules(mha_lib.__path__, "mha_lib."):
        if info.name.rsplit(".", 1)[1].startswith("_"):
            continue
        module = importlib.import_module(info.name)
        tests += [t for t in finder.find(module) if t.examples]
    return sorted(tests, key=lambda t: t.name)


EXAMPLES = _examples()


def test_the_main_entry_points_have_examples() -> None:
    names = {t.name.rsplit(".", 1)[-1] for t in EXAMPLES}
    for name in ("MultiHeadAttention", "scaled_dot_product_attention", "causal_mask",
                 "padding_mask", "encode", "KVCache", "TinyTransformer",
                 "GroupedQueryAttention", "to_torch_mha", "sliding_window_mask"):
        assert name in names, f"{name}: no example in its docstring"


@pytest.mark.parametrize("test", EXAMPLES, ids=lambda t: t.name)
def test_docstring_example_runs(test: doctest.DocTest) -> None:
    """Each example the API page shows runs and prints what it says, with ``torch`` and
    the names of ``mha_lib.__all__`` in scope (as the page's conventions say), after
    ``torch.manual_seed(0)``."""
    import mha_lib
    test.globs = {"torch": torch, **{n: getattr(mha_lib, n) for n in mha_lib.__all__}}
    torch.manual_seed(0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    report: list[str] = []
    runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)


def test_a_wrong_example_fails() -> None:
    """The check can fail: an example that prints something else is caught."""
    import mha_lib
    wrong = doctest.DocTestParser().get_doctest(
        ">>> causal_mask(2).int().tolist()\n[[1, 1], [1, 1]]\n",
        {"causal_mask": mha_lib.causal_mask}, "wrong", None, 0)
    runner = doctest.DocTestRunner()
    runner.run(wrong, out=lambda text: None)
    assert runner.failures == 1


def checker_rows(text: str) -> list[tuple[int, str, str]]:
    """The rows of the page's table of checkers: (chapter, checker, what the row says
    it names)."""
    return [(int(m["chapter"]), m["name"], m["names"]) for m in re.finditer(
        r"^\| [^|]* \| \{py:func\}`~mha_lib\.exercises\.chapter(?P<chapter>\d\d)\."
        r"(?P<name>check_\w+)` \| (?P<names>[^|]+) \|$", text, re.MULTILINE)]


def test_the_checker_table_follows_each_chapters_all() -> None:
    """The table lists each chapter's checkers in exercise order, and the folded entries
    follow the module's ``__all__`` (autodoc's bysource order): the two must agree."""
    listed: dict[int, list[str]] = {}
    for chapter, name, _ in checker_rows(API_PAGE.read_text(encoding="utf-8")):
        listed.setdefault(chapter, []).append(name)
    assert listed, "no checker rows found on the page"
    for chapter, names in listed.items():
        module = importlib.import_module(f"mha_lib.exercises.chapter{chapter:02d}")
        in_all = [n for n in module.__all__ if n.startswith("check_")]
        assert names == in_all, f"chapter {chapter}: {names} != {in_all}"


def miscounted_checkers(text: str) -> list[str]:
    """Rows whose count of mistakes ("7: MB or bytes for MiB, ...") is not the number
    the checker's catalogue registers."""
    from mha_lib.exercises.verdict import CATALOGUE
    return [f"{name}: the page says {names.split(':')[0]}, the checker names "
            f"{len(CATALOGUE[name])}" for _, name, names in checker_rows(text)
            if names.split(":")[0] != str(len(CATALOGUE[name]))]


def test_the_checker_table_counts_each_checkers_mistakes() -> None:
    text = API_PAGE.read_text(encoding="utf-8")
    assert len(checker_rows(text)) == len(
        [n for n in exercises_all() if n.startswith("check_")])
    assert not miscounted_checkers(text), miscounted_checkers(text)
    planted = text.replace("| 11: MB or bytes for MiB",
                           "| 10: MB or bytes for MiB")
    assert miscounted_checkers(planted) == [
        "check_weights_mib: the page says 10, the checker names 11"]


def exercises_all() -> list[str]:
    from mha_lib import exercises
    return list(exercises.__all__)
