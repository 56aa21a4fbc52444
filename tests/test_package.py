"""The installed package: its version and its type hints (PEP 561)."""

from importlib import metadata
from importlib.resources import files

import mha_lib


def test_version_is_the_installed_distributions():
    assert isinstance(mha_lib.__version__, str)
    assert mha_lib.__version__.count(".") == 2
    assert metadata.version("mha_lib") == mha_lib.__version__


def test_the_package_is_marked_as_typed():
    assert files("mha_lib").joinpath("py.typed").is_file()
    # and the built distribution ships it (package-data in pyproject.toml)
    from pathlib import Path

    import tomllib

    pyproject = Path(__file__).parent.parent / "pyproject.toml"
    config = tomllib.loads(pyproject.read_text())
    assert "py.typed" in config["tool"]["setuptools"]["package-data"][
        "mha_lib"]


def test_import_does_not_load_the_compiler():
    """``import mha_lib`` runs at the top of every chapter: loading PyTorch's
    compiler (torch._dynamo) there would cost seconds per notebook."""
    import subprocess
    import sys

    probe = subprocess.run(
        [sys.executable, "-c", "import sys, mha_lib, mha_lib.exercises, mha_lib.viz; "
         "print(sorted(m for m in ('torch._dynamo', 'torch._inductor') if m in sys.modules))"],
        capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "[]", probe.stdout
