"""Shared fixtures: the strictly built book, and the pages _toc.yml lists.

The book is built once per pytest session, from scratch (`--all`, into a fresh
temporary folder), so no state from earlier runs or from `make book` is reused.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from filelock import FileLock

REPO = Path(__file__).resolve().parent.parent
TOC = REPO / "_toc.yml"
# The jupyter-book next to the running interpreter, i.e. the venv's.
JUPYTER_BOOK = Path(sys.executable).parent / "jupyter-book"
BUILD_TIMEOUT_S = 1800


def toc_docnames(toc_path: Path = TOC) -> list[str]:
    """Every page named in _toc.yml (root first, then in reading order), without suffix."""
    toc = yaml.safe_load(toc_path.read_text(encoding="utf-8"))
    names: list[str] = [toc["root"]]

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if "file" in node:
                names.append(node["file"])
            for key in ("parts", "chapters", "sections", "subtrees", "entries"):
                walk(node.get(key))
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(toc)
    # "book/intro.md" and "book/intro" both mean docname "book/intro"
    return [str(Path(n).with_suffix("")) if Path(n).suffix in {".md", ".ipynb"} else n
            for n in names]


@pytest.fixture(scope="session")
def toc_pages() -> list[str]:
    return toc_docnames()


@pytest.fixture(scope="session")
def built_book(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the book exactly like `make book` (-W -n --keep-going --all); return the html dir.

    Fails, with the whole build log, on a non-zero exit or on any WARNING in the log. Under
    pytest-xdist (`make test` runs three workers) the workers share one build: the first to
    get here builds into the session's common temporary folder, the others wait for it.
    """
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent  # common to all workers
        with FileLock(str(shared / "book.lock")):
            return _build_once(shared / "book")
    return _build_once(tmp_path_factory.mktemp("book"))


# The repository the "published" build is given (a name no real repository link may use).
PUBLISHED_REPOSITORY = "https://github.com/example-owner/example-book"
PUBLISHED_PAGES = ["book/intro", "book/08_multi_head_attention"]


@pytest.fixture(scope="session")
def published_book(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The book built as published from ``PUBLISHED_REPOSITORY`` (``BOOK_REPOSITORY`` set):
    two pages only (a table of contents of its own), enough for its buttons and
    downloads; not strict, since the root page links pages this build leaves out."""
    out = tmp_path_factory.mktemp("published")
    toc = out / "_toc.yml"
    toc.write_text(yaml.safe_dump({
        "format": "jb-book", "root": PUBLISHED_PAGES[0],
        "parts": [{"caption": "Some chapters", "numbered": True,
                   "chapters": [{"file": f} for f in PUBLISHED_PAGES[1:]]}]}),
        encoding="utf-8")
    return _build_once(out, ["--toc", str(toc)], {"BOOK_REPOSITORY": PUBLISHED_REPOSITORY},
                       strict=False)


def _build_once(out: Path, extra: list[str] | None = None,
                env: dict[str, str] | None = None, strict: bool = True) -> Path:
    """The html dir of a build into `out`, building unless a build there already ran.

    The default build is the unpublished book (``BOOK_REPOSITORY`` empty, whatever the
    clone's ``origin``): no repository or launch buttons."""
    log_file = out / "build.log"
    if not log_file.is_file():
        out.mkdir(parents=True, exist_ok=True)
        cmd = [str(JUPYTER_BOOK), "build", str(REPO), "--keep-going", "--all",
               "--path-output", str(out), *(["-W", "-n"] if strict else []), *(extra or [])]
        environ = {**os.environ, "BOOK_REPOSITORY": "", **(env or {})}
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=environ,
                              stdin=subprocess.DEVNULL, timeout=BUILD_TIMEOUT_S)
        log = f"$ {' '.join(cmd)}\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
        log_file.write_text(f"{proc.returncode}\n{log}", encoding="utf-8")
    code, log = log_file.read_text(encoding="utf-8").split("\n", 1)
    if code != "0":
        pytest.fail(f"book build failed (exit code {code}):\n{log}", pytrace=False)
    if strict and "WARNING" in log:
        warnings = "\n".join(line for line in log.splitlines() if "WARNING" in line)
        pytest.fail(f"book build logged warnings:\n{warnings}\n\nfull log:\n{log}",
                    pytrace=False)
    html = out / "_build" / "html"
    if not (html / "index.html").is_file():
        pytest.fail(f"book build produced no {html / 'index.html'}:\n{log}", pytrace=False)
    return html


# --- scheduling under pytest-xdist (`make test`: three workers, --dist loadscope) -----------
# Each test module, and each notebook (whose cells share one kernel), runs whole on one
# worker, handed out in the order below (--no-loadscope-reorder). The book build and the
# browser crawl that needs it are the longest chain of the run (about 90 s), so the build
# goes first; two long notebooks keep the other workers busy until the build is done, and
# the first free one takes the crawl. Then the rest, longest first (CPU seconds measured in
# one run, in brackets), so that no long file starts near the end while the other workers
# sit idle: test_practitioner, alphabetically late, once ran alone for its last ~40 s.
FIRST = ("tests/test_book.py", "book/15_attention_at_work.ipynb",
         "book/12_transformer_block.ipynb", "tests/test_browser.py",
         "tests/test_practitioner.py",  # [43] compiles and exports every module
         "book/14_kv_cache_and_gqa.ipynb",  # [14]
         "tests/test_exercises_catalogue.py",  # [14]
         "book/13_cost_and_speed.ipynb",  # [12]
         "book/17_sliding_windows_alibi_flex.ipynb",  # [11]
         "book/appendix_a_masks.ipynb",  # [9]
         "tests/test_no_surprises.py",  # [9]
         "tests/test_latent.py",  # [7]
         "tests/test_explorer.py")  # [7]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = Path(str(item.path)).relative_to(REPO).as_posix()
        if path in FIRST:
            return FIRST.index(path)
        # then the other notebooks (4-8 s of CPU each), and the many short test files
        return len(FIRST) + (not path.endswith(".ipynb"))

    items.sort(key=rank)  # stable: within a file, and within each rank, the order stays
