"""The Chromium the browser tests drive, wherever ``make test`` runs.

In order: ``$CHROMIUM`` if set; Debian's ``/usr/bin/chromium`` (``make test`` installs it
with apt-get where there is one); Playwright's own build, on macOS and other systems
(``make test`` runs ``.venv/bin/playwright install chromium`` where there is no apt-get).
With none of them, the browser tests are skipped with one line saying how to get one,
except under CI, where a missing browser is a failure.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

import pytest

SYSTEM = Path("/usr/bin/chromium")
HOW = ("no Chromium for the browser tests: install Debian's (`apt-get install chromium`) "
       "or Playwright's (`.venv/bin/playwright install chromium`), or set CHROMIUM")
LAUNCH_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


@cache
def executable() -> str | None:
    """The path of the Chromium to drive, or None."""
    given = os.environ.get("CHROMIUM", "").strip()
    if given:
        return given if Path(given).exists() else None
    if SYSTEM.exists():
        return str(SYSTEM)
    try:
        from playwright.sync_api import sync_playwright
        with sync_playwright() as pw:
            own = pw.chromium.executable_path
    except Exception:  # noqa: BLE001 (no playwright, or no browser of its own)
        return None
    return own if own and Path(own).exists() else None


def under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require() -> str:
    """The executable, or skip (fail under CI) with one line saying how to get one."""
    path = executable()
    if path is None:
        if under_ci():
            pytest.fail(f"browser tests cannot run under CI: {HOW}", pytrace=False)
        pytest.skip(HOW)
    return path


def launch(pw: object) -> object:
    """A headless Chromium from a ``sync_playwright()`` handle."""
    return pw.chromium.launch(executable_path=require(), args=LAUNCH_ARGS)
