"""Install requirements.txt into .venv: what `make` runs when the venv is new or stale.

    .venv/bin/python tests/install_venv.py

Two steps, as before: on Linux, torch first from PyTorch's CPU-only index (PyPI's Linux
torch is the CUDA build, about 2.7 GB more), after one probe with a 5 s timeout and with no
retries against that index; then everything in requirements.txt.

The installer is uv where it can be had (``pip install uv``, a binary wheel only): it
fetches and unpacks the ~100 packages in parallel, where pip takes them one at a time
(on the 2-core machine that builds this book: about 30 s instead of 80 s). uv does not read
pip's configuration, so the settings pip would use (``pip config list``: index-url,
extra-index-url, find-links, constraint, trusted-host, cert, timeout, no-index, from its
files and its PIP_* variables) are passed to uv as the matching options, and uv picks the
best version across all indexes, as pip does (``--index-strategy unsafe-best-match``).
Where uv cannot be installed, or fails, pip does the same install, as it always did.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
UV = "uv==0.13.9"
PIP = [sys.executable, "-m", "pip"]

# pip option -> uv option, for the pip settings that decide where packages come from
LIST_OPTIONS = {"extra-index-url": "--extra-index-url", "find-links": "--find-links",
                "constraint": "--constraint", "trusted-host": "--allow-insecure-host"}
ENV_OPTIONS = {"cert": "SSL_CERT_FILE", "timeout": "UV_HTTP_TIMEOUT",
               "default-timeout": "UV_HTTP_TIMEOUT", "proxy": "HTTPS_PROXY"}
SECTIONS = (":env:", "install", "global")  # pip's precedence, highest first


def pip_settings(listing: str) -> dict[str, str]:
    """`pip config list`'s lines (``global.find-links='/opt/wheels'``) as one setting per
    option, the one pip itself would use: a PIP_* variable, then [install], then [global]."""
    found: dict[tuple[str, str], str] = {}
    for line in listing.splitlines():
        match = re.fullmatch(r"(:env:|[\w-]+)\.([\w-]+)='(.*)'", line.strip())
        if match:
            found[match.group(1), match.group(2)] = match.group(3)
    settings: dict[str, str] = {}
    for section in reversed(SECTIONS):
        settings.update({key: value for (sec, key), value in found.items() if sec == section})
    return settings


def uv_options(settings: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """uv's command-line options and environment for pip's settings."""
    args = ["--index-strategy", "unsafe-best-match"]
    env: dict[str, str] = {}
    if "index-url" in settings:
        args += ["--index-url", settings["index-url"]]
    for key, option in LIST_OPTIONS.items():
        for value in settings.get(key, "").split():
            args += [option, value]
    if settings.get("no-index", "").lower() in {"1", "true", "yes", "on"}:
        args.append("--no-index")
    for key, variable in ENV_OPTIONS.items():
        if key in settings and variable not in os.environ:
            env[variable] = settings[key]
    return args, env


def uv_installer() -> list[str] | None:
    """``uv pip install`` into this venv, with pip's settings; None where uv is not had."""
    got = subprocess.run([*PIP, "install", "-q", "--no-compile", "--only-binary", ":all:", UV],
                         stdin=subprocess.DEVNULL)
    uv = Path(sys.executable).parent / "uv"
    if got.returncode != 0 or not uv.is_file():
        print(f"install: {UV} could not be installed; pip installs everything", flush=True)
        return None
    return [str(uv), "pip", "install", "--python", sys.executable]


def install(installer: list[str] | None, extra_env: dict[str, str], *args: str) -> bool:
    cmd = [*(installer or [*PIP, "install", "--no-compile"]), *args]
    env = {**os.environ, **(extra_env if installer else {})}
    return subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL).returncode == 0


def torch_pin() -> str:
    text = (REPO / "requirements.txt").read_text(encoding="utf-8")
    return re.search(r"^torch==\S+", text, re.MULTILINE).group(0)


def has_torch() -> bool:
    return subprocess.run([sys.executable, "-c", "import torch"], capture_output=True,
                          stdin=subprocess.DEVNULL).returncode == 0


def cpu_index_reachable() -> bool:
    try:
        urllib.request.urlopen(f"{TORCH_CPU_INDEX}/torch/", timeout=5).close()
    except OSError:
        return False
    return True


# Imported once after installing, so that Python compiles them once, into the bytecode cache
# make keeps in .venv/pycache: a test run starts many processes at once (three workers,
# each notebook's kernel, two book builds), and on a new venv each compiled torch, sympy
# and matplotlib for itself (38 s of the first `make test` on the 2-core machine that
# builds this book, against a run with the cache in place).
WARM = """
import torch, torch.testing
torch.testing.assert_close(torch.zeros(1), torch.zeros(1))  # imports sympy
import matplotlib.pyplot, einops, hypothesis, ipykernel.kernelapp, nbclient, nbval
import myst_nb, sphinx.application, jupyter_book.cli.main, playwright.sync_api
import mha_lib, mha_lib.exercises, mha_lib.viz
"""


def warm_bytecode() -> None:
    if subprocess.run([sys.executable, "-c", WARM], stdin=subprocess.DEVNULL).returncode:
        print("install: warming the bytecode cache failed (nothing else depends on it)")


def main() -> int:
    listing = subprocess.run([*PIP, "config", "list"], capture_output=True, text=True,
                             stdin=subprocess.DEVNULL).stdout
    uv_args, uv_env = uv_options(pip_settings(listing))
    installer = uv_installer()
    steps = []  # (uv's options, uv's environment, pip's options, what to install)
    if platform.system() == "Linux" and not has_torch():
        if cpu_index_reachable():
            print(f"torch: the CPU-only build from {TORCH_CPU_INDEX}", flush=True)
            no_retries = {"UV_HTTP_TIMEOUT": "30", "UV_HTTP_RETRIES": "1"}
            steps.append((["--index-url", TORCH_CPU_INDEX], {**uv_env, **no_retries},
                          ["--timeout", "30", "--retries", "1",
                           "--index-url", TORCH_CPU_INDEX], [torch_pin()]))
        else:
            print(f"torch: {TORCH_CPU_INDEX} cannot be reached; torch comes from the "
                  "configured indexes", flush=True)
    steps.append((uv_args, uv_env, [], ["-r", str(REPO / "requirements.txt")]))
    for uv_only, env, pip_only, what in steps:
        if installer and install(installer, env, *uv_only, *what):
            continue
        if installer:
            print("install: uv failed; pip tries the same", flush=True)
        if not install(None, {}, *pip_only, *what):
            return 1
    warm_bytecode()
    return 0


if __name__ == "__main__":
    sys.exit(main())
