"""The opset explorer's page opened in Debian's chromium, driven by playwright (no browser download):
skipped where chromium is absent, a failure where PT2B_REQUIRE_BROWSER says it must be there (.ci/run)."""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
from collections.abc import Iterator

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# a headless run that reaches nothing outside the machine
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


@contextlib.contextmanager
def opened(html: pathlib.Path) -> Iterator:
    """A playwright page showing ``html``; on leaving, no script error may have happened on it."""
    if not os.path.exists(CHROMIUM):
        if os.environ.get("PT2B_REQUIRE_BROWSER"):
            pytest.fail(f"PT2B_REQUIRE_BROWSER is set but {CHROMIUM} is missing (apt-get install chromium)")
        pytest.skip("Debian's chromium is not installed (.ci/run installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(html.resolve().as_uri())
        yield page
        assert not errors, errors
        browser.close()
