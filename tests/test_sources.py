"""Checks on the book's sources that need no build.

* Every code-cell line of book/*.ipynb is at most 76 characters, so that code never
  scrolls sideways in the book's column at 1280 px (and reads in a notebook too).
* No project jargon reaches readers: "seed" meaning one of the source notebooks the
  project started from ("seed 001", "seeds", "the seed's", "seed notebook"), "grew from"
  or "original notebook". Readers know those notebooks by their names (Phillips' article,
  d2l, the einops examples; see DESIGN.md). "seed" in its random-number sense stays:
  ``torch.manual_seed(0)``, ``seed=0``, "random seeds", "we seed the generator".
  Checked in: notebook markdown, code comments and strings, stored printed outputs, the
  Markdown pages of book/, and the docstrings of the mha_lib objects the API page shows.
"""

from __future__ import annotations

import importlib
import inspect
import io
import re
import tokenize
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parent.parent
BOOK = REPO / "book"
API_PAGE = BOOK / "appendix_b_api.md"
NOTEBOOKS = sorted(p for p in BOOK.glob("*.ipynb"))
PAGES = sorted(BOOK.glob("*.md"))
MAX_CODE_LINE = 76

# --- the jargon rule ----------------------------------------------------------------------

JARGON = [
    # "seed 001", "seeds 001 and 002", "Seed 004:", "seed004": a source notebook by number
    (re.compile(r"\bseeds?[\s_-]*0\d\d(?!\d)", re.I), "a source notebook by its number"),
    (re.compile(r"\bseeds?\s+notebooks?\b", re.I), "\"seed notebook\""),
    # "the seed", "the seed's", "for the seed", "in the seed" (not "the seed of the
    # generator", "the seed value", "the seed = 0")
    (re.compile(r"\bthe\s+seed(?:['\u2019]s)?\b(?!\s*=)(?!\s+(?:of|value|number)\b)", re.I),
     "\"the seed\" meaning a source notebook"),
    (re.compile(r"\bseed['\u2019]s\b", re.I), "\"seed's\""),
    # "seeds" unless random ones: "random seeds", "three random seeds" stay
    (re.compile(r"(?<!random )\bseeds\b", re.I), "\"seeds\" (say \"random seeds\" if meant)"),
    (re.compile(r"\bgr(?:ew|own)\s+(?:out\s+of|from)\b", re.I), "\"grew from\""),
    (re.compile(r"\boriginal\s+notebooks?\b", re.I), "\"original notebook\""),
    (re.compile(r"\bsource\s+notebooks?\b", re.I), "\"source notebook\""),
]


def jargon(text: str) -> list[str]:
    """The jargon in ``text``: one "what: ...context..." line per hit."""
    hits = []
    for pattern, what in JARGON:
        for m in pattern.finditer(text):
            context = text[max(0, m.start() - 30): m.end() + 30].replace("\n", " ")
            hits.append(f"{what}: ...{context}...")
    return hits


ALLOWED = [
    "torch.manual_seed(0)", "np.random.seed(1)", "gen = torch.Generator().manual_seed(3)",
    "We seed right before creating it, so the numbers repeat.",
    "the table above (seed 0)", "make_batch(seed=7)", "def f(seed: int): ...",
    "Averaged over five random seeds.", "the seed of the generator", "a generator seed",
    "A generator with its own seed makes every batch the same.", "seeded = make()",
    "the seed = 0 line", "Each random seed gives a different table.",
    "the vocabulary grows from our 14 to tens of thousands",
]
FORBIDDEN = [
    "as in seed 001", "Seeds 001 and 002 test `mask == 0`", "## Seed 004: bool",
    "(seed 003)", "the seed's names", "The seed splits the queries", "A mask for the seed",
    "in the seed notebook", "the notebooks this book grew from", "the seeds",
    "one of the original notebooks",
    "the code it has grown out of", "seed004_attention", "our source notebook",
]


@pytest.mark.parametrize("text", ALLOWED)
def test_jargon_rule_allows_random_seeds(text: str) -> None:
    assert jargon(text) == []


@pytest.mark.parametrize("text", FORBIDDEN)
def test_jargon_rule_catches_source_notebook_names(text: str) -> None:
    assert jargon(text), f"not caught: {text!r}"


# --- what readers see -------------------------------------------------------------------------

def _comments_and_strings(source: str) -> str:
    """A code cell's comments and string literals (identifiers are code, not prose)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return source  # not plain Python (a magic?): check all of it
    kinds = {tokenize.COMMENT, tokenize.STRING}
    kinds |= {getattr(tokenize, n) for n in ("FSTRING_MIDDLE",) if hasattr(tokenize, n)}
    return "\n".join(t.string for t in tokens if t.type in kinds)


def _outputs(cell: nbformat.NotebookNode) -> str:
    texts = []
    for out in cell.get("outputs", []):
        if "text" in out:
            texts.append(out["text"])
        for mime in ("text/plain", "text/markdown", "text/html"):
            if mime in out.get("data", {}):
                texts.append(out["data"][mime])
    return "\n".join(texts)


def notebook_prose(path: Path) -> list[tuple[str, str]]:
    """(where, text) for everything of a notebook that readers read as text."""
    nb = nbformat.read(path, as_version=4)
    out = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            out.append((f"{path.name} cell {i} (markdown)", cell.source))
        elif cell.cell_type == "code":
            out.append((f"{path.name} cell {i} (comments, strings)",
                        _comments_and_strings(cell.source)))
            out.append((f"{path.name} cell {i} (output)", _outputs(cell)))
    return out


AUTODOC = re.compile(r"^\.\. auto(module|class|function|exception|data)::\s*(\S+)"
                     r"((?:\n   :[^\n]*)*)", re.MULTILINE)


def _resolve(dotted: str) -> object:
    parts = dotted.replace("::", ".").split(".")  # autodoc's module::qualname form
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(dotted)


def api_docstrings(page: Path = API_PAGE) -> list[tuple[str, str]]:
    """(name, docstring) of every object the API page documents, members included."""
    out = []
    for kind, name, options in AUTODOC.findall(page.read_text(encoding="utf-8")):
        obj = _resolve(name)
        out.append((name, inspect.getdoc(obj) or ""))
        members = re.search(r":members:(.*)", options)
        if members is None or kind == "module" and not members.group(1).strip():
            continue
        listed = [m.strip() for m in members.group(1).split(",") if m.strip()]
        for member in listed or [m for m in vars(obj) if not m.startswith("_")]:
            attr = getattr(obj, member, None)
            if attr is not None and getattr(attr, "__doc__", None):
                out.append((f"{name}.{member}", inspect.getdoc(attr) or ""))
    return out


def test_api_page_docstrings_are_found() -> None:
    names = [name for name, _ in api_docstrings()]
    assert "mha_lib.MultiHeadAttention" in names and len(names) > 20, names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_has_no_jargon(path: Path) -> None:
    hits = [f"{where}: {hit}" for where, text in notebook_prose(path) for hit in jargon(text)]
    assert not hits, "jargon readers do not know (name the source instead):\n  " + \
        "\n  ".join(hits)


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_page_has_no_jargon(path: Path) -> None:
    hits = jargon(path.read_text(encoding="utf-8"))
    assert not hits, f"{path.name}:\n  " + "\n  ".join(hits)


def test_api_docstrings_have_no_jargon() -> None:
    hits = [f"{name}: {hit}" for name, doc in api_docstrings() for hit in jargon(doc)]
    assert not hits, "docstrings shown on the API page:\n  " + "\n  ".join(hits)


# --- code lines -------------------------------------------------------------------------------

@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_code_lines_fit_the_column(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    long = [f"cell {i} line {n}: {len(line)} chars: {line[:60]}..."
            for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
            for n, line in enumerate(cell.source.splitlines(), 1)
            if len(line) > MAX_CODE_LINE]
    assert not long, (f"{path.name}: code lines longer than {MAX_CODE_LINE} characters:\n  "
                      + "\n  ".join(long))
