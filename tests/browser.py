"""Pages the tests look at as a person would: Debian's Chromium, headless, every console error and page error kept."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def chromium_page() -> Iterator[tuple[Any, list[str]]]:
    """A new page of a headless Chromium, and the errors it reports while the test uses it."""
    from playwright.sync_api import sync_playwright

    assert shutil.which("chromium"), "Debian's chromium is needed (scripts/install.sh installs it)"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=shutil.which("chromium"),
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"],
        )
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors: list[str] = []
        page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
        page.on("pageerror", lambda error: errors.append(str(error)))
        try:
            yield page, errors
        finally:
            browser.close()
