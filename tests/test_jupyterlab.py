"""The chapters in JupyterLab with its MyST renderer (jupyterlab-myst), in Chromium.

Run by ``make test-jupyterlab``, which installs JupyterLab and jupyterlab-myst at the
versions of requirements-notebooks.txt; without them (``make test``) these tests skip.
A JupyterLab server on the loopback serves a copy of book/; Chromium opens two chapters
and reads what a reader sees: no raw MyST syntax, the exercises as headings, the
solutions folded, the library's source as code, the embedded figures loaded.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import chromium, front_matter
from tests.test_frontends import CHAPTERS, RAW

pytestmark = pytest.mark.browser
pytest.importorskip("jupyterlab", reason="needs JupyterLab: run `make test-jupyterlab`")
pytest.importorskip("jupyterlab_myst", reason="needs jupyterlab-myst: `make test-jupyterlab`")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("lab")
    shutil.copytree(front_matter.BOOK, root / "book")
    settings = root / "settings"
    settings.mkdir()
    # every cell rendered (no windowing), so that the page holds the whole chapter
    (settings / "overrides.json").write_text(json.dumps({
        "@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"},
        "@jupyterlab/apputils-extension:notification": {"fetchNews": "false",
                                                        "checkForUpdates": False}}))
    log = (root / "server.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--port=18765",
         "--port-retries=50", "--ServerApp.ip=127.0.0.1", "--IdentityProvider.token=",
         "--allow-root",
         "--ServerApp.password=", f"--ServerApp.root_dir={root / 'book'}",
         f"--LabApp.user_settings_dir={root / 'user-settings'}",
         f"--LabApp.app_settings_dir={settings}"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = None
    for _ in range(120):
        time.sleep(0.5)
        found = re.search(r"http://127\.0\.0\.1:(\d+)/lab",
                          (root / "server.log").read_text(errors="replace"))
        if found:
            url = f"http://127.0.0.1:{found.group(1)}"
            break
    try:
        if url is None:
            pytest.fail("JupyterLab did not start:\n" + (root / "server.log").read_text())
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


@pytest.mark.parametrize("name", CHAPTERS)
def test_jupyterlab_with_myst_shows_no_raw_syntax(name: str, lab: str) -> None:
    chromium.require()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = chromium.launch(pw)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.route("**/*", lambda route, request: route.continue_()
                   if request.url.startswith((lab, "data:", "blob:")) else route.abort())
        page.goto(f"{lab}/lab/tree/{name}?reset")  # a fresh workspace: this tab alone
        page.wait_for_selector(".jp-Notebook .jp-MarkdownCell", timeout=240_000)
        page.wait_for_timeout(5000)  # kernels, renderers and images settle
        text = page.evaluate("() => document.querySelector('.jp-Notebook').innerText")
        images = page.evaluate("() => [...document.querySelectorAll('.jp-Notebook img')]"
                               ".map(i => [i.alt.slice(0, 40), i.naturalWidth])")
        codes = page.evaluate("() => [...document.querySelectorAll('.jp-Notebook "
                              ".jp-OutputArea pre, .jp-Notebook .jp-OutputArea code')]"
                              ".map(p => p.innerText)")
        page.screenshot(path=str(Path(front_matter.REPO, "_build", "screenshots",
                                      f"jupyterlab-{name[:2]}.png")))
        browser.close()
    raw = sorted({m.group(0) for m in RAW.finditer(text)})
    assert not raw, f"{name}: raw MyST syntax visible in JupyterLab: {raw}"
    number = int(name[:2])
    assert f"Exercise {number}.1:" in text and f"Solution to Exercise {number}.1" in text
    assert any("def " in c for c in codes), f"{name}: the library's source is not code"
    assert all(width > 0 for _, width in images), f"{name}: an image did not load: {images}"
