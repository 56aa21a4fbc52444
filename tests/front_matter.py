"""Give every notebook of book/ its stored form (``_ext/notebook_forms.py`` says what that is).

For each ``book/*.ipynb``, idempotently (a second run changes nothing) and without
touching any output: the set-up cell (first code cell), the install note and the chapter's
strip under the title, figures embedded as attachments, exercises and solutions numbered,
solutions folded in JupyterLab and Colab. The repository named in the set-up cell and the
install note is the book's one setting (``BOOK_REPOSITORY``, else a GitHub ``origin``,
else none); the notebook records it in its metadata (``mha_book.repository``).

Usage (from the repository root)::

    .venv/bin/python tests/front_matter.py            # update every book/*.ipynb
    .venv/bin/python tests/front_matter.py book/07_masking.ipynb
    .venv/bin/python tests/front_matter.py --check    # change nothing; exit 1 if needed
    .venv/bin/python tests/front_matter.py --repository https://github.com/owner/name
    .venv/bin/python tests/front_matter.py --check --repository https://github.com/o/n

Run it after adding a chapter, changing exercises or figures, or to stamp the notebooks
with the repository before committing them for publication (Colab opens the committed
notebooks). ``--check`` compares each notebook with the form for the repository it
records, so it passes in any clone; ``tests/test_front_matter.py`` runs it.
"""

from __future__ import annotations

import argparse
import sys
from functools import cache
from pathlib import Path

import nbformat
import yaml

REPO = Path(__file__).resolve().parent.parent
BOOK = REPO / "book"
TOC = REPO / "_toc.yml"
sys.path.insert(0, str(REPO / "_ext"))

import notebook_forms as forms  # noqa: E402


@cache
def chapter_numbers(toc: Path = TOC) -> dict[str, int]:
    """Docname -> chapter number, counted as Jupyter Book numbers them: through the
    numbered parts of _toc.yml in order, continuing from part to part."""
    data = yaml.safe_load(toc.read_text(encoding="utf-8"))
    numbers: dict[str, int] = {}
    for part in data.get("parts", []):
        if not part.get("numbered"):
            continue
        for chapter in part.get("chapters", []):
            numbers[str(Path(chapter["file"]).with_suffix(""))] = len(numbers) + 1
    return numbers


def chapter_of(path: Path) -> int | None:
    docname = path.resolve().relative_to(REPO).with_suffix("").as_posix()
    return chapter_numbers().get(docname)


def book_notebooks(book: Path = BOOK) -> list[Path]:
    """Every notebook of the book (the same set `make execute` and nbval use)."""
    return sorted(
        p for p in book.rglob("*.ipynb")
        if not any(part.startswith((".", "_")) for part in p.relative_to(book).parts)
    )


def recorded_repository(nb: nbformat.NotebookNode) -> str | None:
    """The repository a stored notebook was stamped with (None: unpublished)."""
    return nb.metadata.get(forms.META, {}).get("repository") or None


def updated(nb: nbformat.NotebookNode, repo: str | None, chapter: int | None) -> bool:
    """Stamp ``nb`` for ``repo``; True if anything changed."""
    before = nbformat.writes(nb)
    forms.stamp(nb, repo, chapter)
    return nbformat.writes(nb) != before


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: book/**/*.ipynb")
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if a notebook is not in its stored "
                             "form for the repository it records")
    parser.add_argument("--repository", help="stamp with this GitHub repository ('' for "
                        "none); default: the book's setting")
    args = parser.parse_args(argv)
    if args.repository is not None:
        repo = forms.github_repository(args.repository) if args.repository else None
        if args.repository and repo is None:
            parser.error(f"--repository: expected https://github.com/owner/name, "
                         f"got {args.repository!r}")
    else:
        repo = forms.repository()
    stale = []
    for path in args.notebooks or book_notebooks():
        nb = nbformat.read(path, as_version=4)
        # --check alone: the form for the repository the notebook records (any clone);
        # --check --repository URL: the notebooks must be stamped for URL
        target = recorded_repository(nb) if args.check and args.repository is None else repo
        if not updated(nb, target, chapter_of(path)):
            continue
        stale.append(path)
        if not args.check:
            nbformat.validate(nb)
            nbformat.write(nb, path)
            print(f"updated {path}")
    if args.check and stale:
        print("notebooks not in their stored form (run tests/front_matter.py):\n  "
              + "\n  ".join(map(str, stale)), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
