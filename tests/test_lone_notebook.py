"""A chapter opened on its own, outside the book and the repository, says what it needs.

A notebook downloaded from the book (or opened on Colab) lands in a folder of its own, in
a Python that may lack ``mha_lib``. Its first code cell must say, before anything else
runs, how to install it. Here a notebook is copied alone into an empty folder and run in
a virtual environment that has everything the chapters use (torch, matplotlib, the
kernel) except ``mha_lib``: the first error must be that message, from the set-up cell.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from tests import front_matter

forms = front_matter.forms
CHAPTER = front_matter.BOOK / "16_rotary.ipynb"


@pytest.fixture(scope="module")
def kernel_without_mha_lib(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A kernel name whose Python sees this venv's packages, but not the editable mha_lib
    (the venv's site-packages as a plain path: its .pth files are not read)."""
    root = tmp_path_factory.mktemp("lone-env")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True).stdout.strip())
    (site / "book_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    probe = subprocess.run(  # torch and the kernel are found (not imported: seconds)
        [str(python), "-c", "from importlib.util import find_spec as f; "
         "assert f('torch') and f('ipykernel'); import mha_lib"],
        capture_output=True, text=True, cwd=root)
    assert "No module named 'mha_lib'" in probe.stderr, probe.stderr
    spec = root / "kernels" / "lone"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python without mha_lib", "language": "python"}))
    return str(root)


def _run_alone(nb: nbformat.NotebookNode, folder: Path, jupyter_path: str,
               monkeypatch: pytest.MonkeyPatch) -> tuple[CellExecutionError, list]:
    monkeypatch.setenv("JUPYTER_PATH", jupyter_path)
    client = NotebookClient(nb, kernel_name="lone", timeout=120,
                            resources={"metadata": {"path": str(folder)}})
    with pytest.raises(CellExecutionError) as error:
        client.execute()
    return error.value, nb.cells


@pytest.mark.parametrize("repo", [None, "https://github.com/example-owner/example-book"])
def test_a_lone_notebook_first_says_what_to_install(
        repo: str | None, kernel_without_mha_lib: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "downloads"
    folder.mkdir()
    shutil.copy(CHAPTER, folder / CHAPTER.name)  # alone: no book/, no figures/, no mha_lib
    nb = nbformat.read(folder / CHAPTER.name, as_version=4)
    nb = forms.standalone(nb, repo, front_matter.chapter_of(CHAPTER))
    for cell in nb.cells:  # the stored outputs: nothing must have run when the error comes
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    error, cells = _run_alone(nb, folder, kernel_without_mha_lib, monkeypatch)
    assert error.ename == "ModuleNotFoundError", error
    assert "This chapter needs mha_lib" in error.evalue, error.evalue
    wanted = f"git+{repo}" if repo else 'pip install -e ".[notebooks]"'
    assert wanted in error.evalue, error.evalue
    code = [c for c in cells if c.cell_type == "code"]
    assert forms.is_setup_cell(code[0]) and code[0].outputs, "the set-up cell did not stop"
    assert all(not c.outputs for c in code[1:]), "something ran before the message"
