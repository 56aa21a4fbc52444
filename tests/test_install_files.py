"""The light install for readers: pyproject's `notebooks` extra, requirements-notebooks.txt
and binder/ install what the chapters import, with the CPU build of torch, at the versions
of requirements.txt (the maintainers' full pinned set), and mha_lib from this repository."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parent.parent
CPU_INDEX = "--extra-index-url https://download.pytorch.org/whl/cpu"
LIGHT = ("torch", "einops", "matplotlib", "ipykernel")


def pins(path: Path) -> dict[str, str]:
    found = re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)\s*$", path.read_text(), re.MULTILINE)
    return {name.lower(): version for name, version in found}


def lines(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines()
            if line.strip() and not line.startswith("#")]


def test_notebooks_extra_has_the_reader_tools() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert {"torch", "einops"} <= set(project["dependencies"])
    assert set(project["optional-dependencies"]["notebooks"]) == {
        "matplotlib", "jupyterlab", "jupyterlab-myst", "ipykernel"}


def test_requirements_notebooks_is_the_light_set_at_the_book_versions() -> None:
    full, light = pins(REPO / "requirements.txt"), pins(REPO / "requirements-notebooks.txt")
    assert set(light) == {*LIGHT, "jupyterlab", "jupyterlab-myst"}, light
    # requirements.txt (the tests' set) leaves JupyterLab to `make lab`, which installs
    # requirements-notebooks.txt's pins; everything else is pinned alike in both
    assert "jupyterlab" not in full
    assert all(light[name] == full[name] for name in LIGHT), (light, full)
    makefile = (REPO / "Makefile").read_text()
    assert "grep -E '^(jupyterlab|jupyterlab-myst)==' requirements-notebooks.txt" in makefile
    text = lines(REPO / "requirements-notebooks.txt")
    # no index in the file: where PyTorch's index cannot be reached, pip never waits on it
    # (the CPU-only torch is a separate first step, which the file's header shows)
    assert not any(line.startswith(("--extra-index-url", "--index-url", "-i ")) for line in text)
    assert "-e ." in text
    header = (REPO / "requirements-notebooks.txt").read_text()
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" \
        in header


def test_the_maintainers_install_takes_the_cpu_torch_on_linux_without_retries() -> None:
    """`make` installs torch from PyTorch's CPU index on Linux, after one 5 s probe, and
    falls back to the configured indexes, never retrying the CPU index."""
    makefile = (REPO / "Makefile").read_text()
    recipe = makefile[makefile.index("$(STAMP): requirements.txt"):makefile.index("setup:")]
    assert "$(PY) tests/install_venv.py" in recipe
    script = (REPO / "tests" / "install_venv.py").read_text()
    assert 'platform.system() == "Linux"' in script
    assert 'TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"' in script
    assert 'urlopen(f"{TORCH_CPU_INDEX}/torch/", timeout=5)' in script
    assert '"--retries", "1"' in script and '"--index-url", TORCH_CPU_INDEX' in script
    assert '"UV_HTTP_TIMEOUT": "30", "UV_HTTP_RETRIES": "1"' in script
    assert "--extra-index-url" not in re.sub(r"LIST_OPTIONS = \{[^}]*\}", "", script)


PIP_CONFIG = """\
global.cert='/etc/ssl/certs/ca-certificates.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/wheels'
global.timeout='60'
install.find-links='/srv/wheels'
:env:.default-timeout='180'
:env:.disable-pip-version-check='1'
:env:.find-links='/opt/wheels /more/wheels'
"""


def test_uv_gets_the_indexes_pip_is_configured_with(monkeypatch) -> None:
    """uv reads no pip configuration: the installer passes on what pip would use (a PIP_*
    variable over [install] over [global]), and picks across indexes as pip does."""
    from tests import install_venv

    settings = install_venv.pip_settings(PIP_CONFIG)
    assert settings["find-links"] == "/opt/wheels /more/wheels"  # the variable wins
    assert settings["timeout"] == "60" and settings["default-timeout"] == "180"
    for variable in ("SSL_CERT_FILE", "UV_HTTP_TIMEOUT", "HTTPS_PROXY"):
        monkeypatch.delenv(variable, raising=False)
    args, env = install_venv.uv_options(settings)
    assert args == [
        "--index-strategy", "unsafe-best-match",
        "--extra-index-url", "file:///opt/pypi/simple",
        "--extra-index-url", "file:///opt/pypi-more/simple",
        "--find-links", "/opt/wheels", "--find-links", "/more/wheels",
        "--constraint", "/etc/xdg/pip/constraints.txt"]
    assert env == {"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt",
                   "UV_HTTP_TIMEOUT": "180"}
    assert install_venv.uv_options({"index-url": "https://mirror/simple", "no-index": "1"})[
        0][2:] == ["--index-url", "https://mirror/simple", "--no-index"]


def test_pip_installs_where_uv_cannot_be_had(monkeypatch, capsys) -> None:
    from tests import install_venv

    monkeypatch.setattr(install_venv, "PIP", [sys.executable, "-c", "raise SystemExit(1)"])
    assert install_venv.uv_installer() is None
    assert "pip installs everything" in capsys.readouterr().out


def test_binder_installs_the_light_set_with_cpu_torch() -> None:
    full, binder = pins(REPO / "requirements.txt"), pins(REPO / "binder" / "requirements.txt")
    assert binder.pop("torch") == full["torch"] + "+cpu"
    assert set(binder) == set(LIGHT) - {"torch"} | {"jupyterlab-myst"}
    assert all(binder[name] == full[name] for name in binder if name in full)
    assert binder["jupyterlab-myst"] == pins(REPO / "requirements-notebooks.txt")[
        "jupyterlab-myst"]
    text = lines(REPO / "binder" / "requirements.txt")
    assert text[0] == CPU_INDEX and text[-1] == "."
    # repo2docker reads only binder/ when it exists: nothing there may pull the full set
    assert sorted(p.name for p in (REPO / "binder").iterdir()) == [
        "requirements.txt", "runtime.txt"]


def test_make_writes_bytecode_once_into_the_venv(tmp_path: Path) -> None:
    """Under make, every Python writes its bytecode, into .venv/pycache only, even where the
    caller set PYTHONDONTWRITEBYTECODE (as CI runners do): otherwise each notebook kernel
    and build compiled torch and sympy from source again (about 8 s of CPU each)."""
    probe = tmp_path / "probe.mk"
    probe.write_text(
        "probe:\n\t@" + sys.executable
        + " -c 'import sys; print(sys.dont_write_bytecode, sys.pycache_prefix)'\n")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPYCACHEPREFIX", None)
    out = subprocess.run(
        ["make", "-s", "--no-print-directory", "-f", "Makefile", "-f", str(probe), "probe"],
        cwd=REPO, env=env, capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", str(REPO / ".venv" / "pycache")]
