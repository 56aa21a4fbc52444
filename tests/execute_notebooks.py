"""Re-execute the book's notebooks in place, deterministically.

Usage (from the repo root; `make execute` runs it for every notebook)::

    .venv/bin/python tests/execute_notebooks.py                    # every book/**/*.ipynb
    .venv/bin/python tests/execute_notebooks.py book/01_tokenization.ipynb

Each notebook runs top to bottom in a fresh python3 kernel from *this* interpreter's
environment (the venv), with the notebook's own folder as working directory and a
per-cell timeout. Outputs are kept; volatile metadata is stripped and execution counts
are renumbered 1, 2, 3, ... so a re-run of unchanged code gives a byte-identical file
(set PYTHONHASHSEED=0, as the Makefile does). `make test` then checks the stored
outputs against a fresh run with nbval.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import nbformat
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from traitlets import default

REPO = Path(__file__).resolve().parent.parent
BOOK = REPO / "book"

# Notebook-level metadata that is either volatile or machine-specific.
VOLATILE_NB_METADATA = ("widgets", "papermill", "execution", "toc-autonumbering")
# Cell-level metadata written by the execution itself (timestamps, UI state).
VOLATILE_CELL_METADATA = ("execution", "ExecuteTime", "papermill", "collapsed", "scrolled")


class CurrentEnvKernelSpecs(KernelSpecManager):
    """Always hand out ipykernel running under sys.executable (the venv's python),

    whatever python3 kernelspec a user may have installed in ~/.local/share/jupyter.
    """

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        return KernelSpec(
            argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            display_name="Python 3 (ipykernel)",
            language="python",
            resource_dir="",
        )


class CurrentEnvKernelManager(AsyncKernelManager):
    @default("kernel_spec_manager")
    def _current_env_kernel_specs(self) -> KernelSpecManager:
        return CurrentEnvKernelSpecs()


def coalesce_streams(outputs: list) -> list:
    """Merge consecutive outputs of the same stream: how print()s are split into
    messages depends on timing, what they print does not."""
    merged: list = []
    for out in outputs:
        last = merged[-1] if merged else None
        if (last is not None and out.get("output_type") == "stream"
                and last.get("output_type") == "stream" and last.get("name") == out.get("name")):
            last["text"] = "".join(last["text"]) + "".join(out["text"])
        else:
            merged.append(out)
    return merged


def normalise(nb: nbformat.NotebookNode) -> None:
    """Strip volatile metadata and renumber execution counts from 1, in place."""
    for key in VOLATILE_NB_METADATA:
        nb.metadata.pop(key, None)
    nb.metadata["kernelspec"] = {
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
        "name": "python3",
    }
    count = 0
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = coalesce_streams(cell.get("outputs") or [])
        for key in VOLATILE_CELL_METADATA:
            cell.metadata.pop(key, None)
        if cell.cell_type != "code":
            continue
        if cell.get("outputs") is None:
            cell.outputs = []
        count += 1
        cell.execution_count = count
        for out in cell.outputs:
            if "execution_count" in out:
                out["execution_count"] = count
            # transient display ids are per-session noise
            out.pop("transient", None)


def execute(path: Path, timeout: int, kernel_name: str) -> None:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        kernel_manager_class=CurrentEnvKernelManager,  # client owns it: shut down afterwards
        timeout=timeout,
        kernel_name=kernel_name,
        resources={"metadata": {"path": str(path.parent)}},  # cwd = notebook's folder
        allow_errors=False,
        record_timing=False,  # no execution timestamps in cell metadata
    )
    client.execute()
    normalise(nb)
    nbformat.validate(nb)
    nbformat.write(nb, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "notebooks", nargs="*", type=Path, help="notebooks to run (default: book/**/*.ipynb)"
    )
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    parser.add_argument("--kernel-name", default="python3")
    args = parser.parse_args(argv)

    paths = args.notebooks or sorted(
        p
        for p in BOOK.rglob("*.ipynb")
        if not any(part.startswith((".", "_")) for part in p.relative_to(BOOK).parts)
    )
    if not paths:
        print("no notebooks found", file=sys.stderr)
        return 0
    for path in paths:
        path = path.resolve()
        if not path.is_file():
            print(f"not a file: {path}", file=sys.stderr)
            return 2
        start = time.perf_counter()
        shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
        print(f"executing {shown} ...", end=" ", flush=True)
        execute(path, args.timeout, args.kernel_name)
        print(f"{time.perf_counter() - start:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
