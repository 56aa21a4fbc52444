"""No surprises at run time: nothing in the library, the tests or the book's code cells
reaches the network or unpickles arbitrary code.

Scanned: ``mha_lib/**/*.py``, ``tests/*.py`` and every code cell of ``book/**/*.ipynb``
(IPython ``!shell`` and ``%magic`` lines included). Flagged:

* importing a network client: ``urllib`` (except the pure string functions of
  ``urllib.parse``), ``requests``, ``httpx``, ``urllib3``, ``aiohttp``, ``http.client``,
  ``http.server``, ``socket``, ``ftplib``, ``smtplib``, ``webbrowser``, ``huggingface_hub``;
* ``torch.hub``, ``.from_pretrained(...)`` (except ``nn.Embedding`` / ``nn.EmbeddingBag``'s,
  which build a layer from a local tensor), any name or keyword containing ``download``;
* ``torch.load(...)`` without ``weights_only=True`` (unpickling can run code);
* shell commands that fetch: ``wget``, ``curl``, ``pip install``, ``git clone``, ``git+``
  URLs, in strings (e.g. for ``subprocess``) or in ``!`` / ``%`` lines.

Anything legitimate is listed in ``ALLOWED`` below with the reason, or is one of two
patterns allowed by rule: code inside ``if "google.colab" in sys.modules:`` in a notebook
(the set-up cell that installs ``mha_lib`` on Colab; it does nothing anywhere else), and
the text of an exception being raised (advice such as "pip install ..." in the set-up
cell's ``ModuleNotFoundError``, which runs nothing).
"""

from __future__ import annotations

import ast
import functools
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

NETWORK_MODULES = {"urllib", "urllib.request", "urllib3", "requests", "httpx", "aiohttp",
                   "http.client", "http.server", "socket", "ftplib", "smtplib", "webbrowser",
                   "huggingface_hub"}
LOCAL_FROM_PRETRAINED = {"nn.Embedding", "nn.EmbeddingBag", "torch.nn.Embedding",
                         "torch.nn.EmbeddingBag", "Embedding", "EmbeddingBag"}
FETCH = {  # name -> regex; "pip install" also as list items: "pip", "install"
    "wget": re.compile(r"\bwget\b"),
    "curl": re.compile(r"\bcurl\b"),
    "pip install": re.compile(r"\bpip3?['\",\s]+install\b"),
    "git clone": re.compile(r"\bgit\s+clone\b"),
    "git+": re.compile(r"\bgit\+"),
}

# (file relative to the repo, what is found) -> why it is fine
ALLOWED = {
    ("tests/test_browser.py", "import http.server"):
        "a loopback-only static file server (127.0.0.1, port 0) for the built HTML",
    ("tests/test_notebook_forms.py", "shell: pip install"):
        "asserts the set-up cell's advice text and, with subprocess.run mocked, its Colab "
        "pip command; nothing runs",
    ("tests/test_notebook_forms.py", "shell: git+"):
        "the same set-up cell's `git+<repository>` in those assertions",
    ("tests/test_notebook_forms.py", "def test_a_download_links_to_the_published_book"):
        "checks the links of the book's 'download .ipynb' copies; downloads nothing",
    ("tests/test_install_files.py", "shell: pip install"):
        "asserts the text of requirements-notebooks.txt's header (the CPU-only torch "
        "command a reader runs); nothing runs",
    ("tests/test_lone_notebook.py", "shell: pip install"):
        "asserts the set-up cell's advice (`pip install -e ...`) in the error a lone "
        "notebook raises; nothing is installed",
    ("tests/test_lone_notebook.py", "shell: git+"):
        "the same advice with a repository (`git+<repository>`)",
    ("tests/install_venv.py", "import urllib.request"):
        "make's venv set-up: one 5 s probe of PyTorch's CPU-only index before installing "
        "torch from it; runs only when .venv is created or stale",
    ("tests/install_venv.py", "shell: pip install"):
        "make's venv set-up installs requirements.txt (and uv) into .venv: its purpose",
    ("tests/test_book.py", "name downloads"):
        "the built HTML's 'download .ipynb' buttons (local files under _build)",
}
SELF = "tests/test_no_surprises.py"


def _dotted(node: ast.AST) -> str:
    """``torch.hub.load`` for the expression ``torch.hub.load``; "" for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else node.attr
    return ""


def _is_colab_guard(node: ast.AST) -> bool:
    """``if "google.colab" in sys.modules:``"""
    test = getattr(node, "test", None)
    return (isinstance(node, ast.If) and isinstance(test, ast.Compare)
            and isinstance(test.left, ast.Constant) and test.left.value == "google.colab"
            and len(test.ops) == 1 and isinstance(test.ops[0], ast.In)
            and _dotted(test.comparators[0]) == "sys.modules")


def _network(module: str) -> bool:
    return module != "urllib.parse" and (module in NETWORK_MODULES
                                         or module.split(".")[0] in NETWORK_MODULES)


def _fetches(text: str) -> list[str]:
    return [f"shell: {name}" for name, regex in FETCH.items() if regex.search(text)]


def _parses(source: str) -> bool:
    try:
        ast.parse(source)
    except SyntaxError:
        return False
    return True


def scan_python(source: str, *, notebook: bool = False) -> list[tuple[int, str]]:
    """Findings ``(line, what)`` in Python source (a module or a notebook cell)."""
    shell: dict[int, str] = {}
    if notebook and not _parses(source):  # IPython "!cmd" and "%magic" lines are not Python
        lines = source.splitlines()
        for i, line in enumerate(lines):
            stripped = line.lstrip()
            if stripped.startswith(("!", "%")):
                shell[i + 1] = stripped
                lines[i] = line[: len(line) - len(stripped)] + f"__shell__({i + 1})"
        source = "\n".join(lines)
    tree = ast.parse(source)
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef,
                                    ast.ClassDef))
                  and n.body and isinstance(n.body[0], ast.Expr)
                  and isinstance(n.body[0].value, ast.Constant)}
    findings: list[tuple[int, str]] = []

    def visit(node: ast.AST, guarded: bool) -> None:
        guarded = guarded or (notebook and _is_colab_guard(node)) or isinstance(node, ast.Raise)
        line = getattr(node, "lineno", 0)
        hits: list[str] = []
        if isinstance(node, ast.Import):
            hits += [f"import {a.name}" for a in node.names if _network(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if _network(node.module):
                hits.append(f"import {node.module}")
            if node.module == "torch" and any(a.name == "hub" for a in node.names):
                hits.append("torch.hub")
        elif isinstance(node, ast.Attribute):
            if _dotted(node).endswith("torch.hub"):
                hits.append("torch.hub")
            if node.attr == "from_pretrained" and _dotted(node.value) not in LOCAL_FROM_PRETRAINED:
                hits.append(f"{_dotted(node)}(...)")
        elif isinstance(node, ast.Call):
            name = _dotted(node.func)
            if name == "torch.load" and not any(
                    k.arg == "weights_only" and isinstance(k.value, ast.Constant)
                    and k.value.value is True for k in node.keywords):
                hits.append("torch.load without weights_only=True")
            if name == "__shell__":
                hits += _fetches(shell[node.args[0].value])
            hits += [f"keyword {k.arg}=" for k in node.keywords
                     if k.arg and "download" in k.arg.lower()]
        elif isinstance(node, (ast.List, ast.Tuple)):  # ["pip", "install", ...] for subprocess
            hits += _fetches(" ".join(e.value for e in node.elts if isinstance(e, ast.Constant)
                                      and isinstance(e.value, str)))
        elif isinstance(node, ast.Name) and "download" in node.id.lower():
            hits.append(f"name {node.id}")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                and "download" in node.name.lower():
            hits.append(f"def {node.name}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in docstrings:
            hits += _fetches(node.value)
        if not guarded:
            findings.extend((line, hit) for hit in hits)
        for child in ast.iter_child_nodes(node):
            visit(child, guarded)

    visit(tree, False)
    return sorted(set(findings))


def _sources() -> list[tuple[str, str, bool]]:
    """(label, source, is_notebook) for every scanned file or code cell."""
    out = []
    for path in sorted([*(REPO / "mha_lib").rglob("*.py"), *(REPO / "tests").glob("*.py")]):
        if path.relative_to(REPO).as_posix() == SELF:
            continue  # this file spells out every pattern it looks for
        out.append((path.relative_to(REPO).as_posix(), path.read_text(encoding="utf-8"), False))
    for path in sorted((REPO / "book").rglob("*.ipynb")):
        if any(part.startswith((".", "_")) for part in path.relative_to(REPO).parts):
            continue
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        for i, cell in enumerate(cells):
            if cell["cell_type"] == "code":
                source = "".join(cell["source"])
                out.append((f"{path.relative_to(REPO).as_posix()} cell {i}", source, True))
    return out


SOURCES = _sources()


def test_the_scan_sees_the_library_the_tests_and_the_book():
    labels = [label for label, _, _ in SOURCES]
    assert "mha_lib/attention.py" in labels and "tests/conftest.py" in labels
    assert sum(" cell " in label for label in labels) > 50


@functools.cache
def _scanned(source: str, notebook: bool) -> tuple[tuple[int, str], ...]:
    """scan_python's findings, scanned once for both tests below (same worker)."""
    return tuple(scan_python(source, notebook=notebook))


@pytest.mark.parametrize("label,source,notebook", SOURCES, ids=[s[0] for s in SOURCES])
def test_no_network_access_or_unsafe_unpickling(label, source, notebook):
    findings = [(line, what) for line, what in _scanned(source, notebook)
                if (label, what) not in ALLOWED]
    assert not findings, f"{label}: " + "; ".join(f"line {n}: {w}" for n, w in findings)


def test_every_allowance_is_still_needed():
    """An allowance whose code is gone must go too, or it would hide a later use."""
    found = {(label, what) for label, source, notebook in SOURCES
             for _, what in _scanned(source, notebook)}
    assert set(ALLOWED) - found == set()


# --- the scanner must find what it looks for, and only that ---------------------------------

CAUGHT = [
    ("import requests", "import requests"),
    ("from urllib.request import urlopen", "import urllib.request"),
    ("import urllib", "import urllib"),
    ("import http.client", "import http.client"),
    ("import socket", "import socket"),
    ("torch.hub.load('pytorch/vision', 'resnet18')", "torch.hub"),
    ("from torch import hub", "torch.hub"),
    ("m = AutoModel.from_pretrained('bert-base-uncased')", "AutoModel.from_pretrained(...)"),
    ("datasets.MNIST('.', download=True)", "keyword download="),
    ("hf_hub_download('a/b', 'c')", "name hf_hub_download"),
    ("state = torch.load('w.pt')", "torch.load without weights_only=True"),
    ("state = torch.load('w.pt', weights_only=False)", "torch.load without weights_only=True"),
    ("subprocess.run(['wget', 'http://x/y'])", "shell: wget"),
    ("os.system('curl -O http://x/y')", "shell: curl"),
    ("subprocess.run([sys.executable, '-m', 'pip', 'install', 'x'])", "shell: pip install"),
]


@pytest.mark.parametrize("code,what", CAUGHT)
def test_scanner_catches(code, what):
    assert what in [w for _, w in scan_python(code)]


def test_scanner_catches_shell_lines_and_unguarded_colab_installs():
    assert scan_python("!wget http://example.com/x.csv", notebook=True) == [(1, "shell: wget")]
    assert scan_python("%pip install einops", notebook=True) == [(1, "shell: pip install")]
    unguarded = 'import subprocess, sys\nsubprocess.run(["pip", "install", "git+https://x/y"])'
    assert (2, "shell: pip install") in scan_python(unguarded, notebook=True)


NOT_CAUGHT = [
    "emb = nn.Embedding.from_pretrained(torch.eye(3))",  # a layer from a local tensor
    "from urllib.parse import urljoin",  # string functions
    "state = torch.load(path, weights_only=True)",
    "'''Docstring: we never download anything.'''",
    "x = 1  # a comment may say curl or wget",
    'if "google.colab" in sys.modules:\n'
    '    subprocess.run([sys.executable, "-m", "pip", "install", "git+https://x/y"])',
    'if "google.colab" in sys.modules:\n    !pip install git+https://x/y',
    'raise ModuleNotFoundError("install it: pip install -e .")',  # advice, runs nothing
]


@pytest.mark.parametrize("code", NOT_CAUGHT)
def test_scanner_allows(code):
    assert scan_python(code, notebook=True) == []
