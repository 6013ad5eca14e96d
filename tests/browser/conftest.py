"""What the page tests share: the Chromium they drive and a fresh page of it per test."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def skip_without_chromium() -> None:
    """Skips the calling test module where Chromium or playwright is missing."""
    if not Path(CHROMIUM).exists():
        pytest.skip("chromium is not installed (apt-get install chromium)", allow_module_level=True)
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed")


@pytest.fixture
def browser_page() -> Iterator[object]:
    """A page of a headless Chromium with a profile of its own, closed after the test."""
    from playwright import sync_api

    profile = tempfile.mkdtemp(prefix="fx-chromium-")
    with sync_api.sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=FLAGS, ignore_default_args=["--headless=new"]
        )
        try:
            page = context.pages[0] if context.pages else context.new_page()
            page.set_default_timeout(15_000)
            yield page
        finally:
            context.close()
            shutil.rmtree(profile, ignore_errors=True)
