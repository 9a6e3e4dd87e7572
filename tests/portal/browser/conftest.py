"""Headless Chromium (Debian's package, driven by Playwright) against a live test server.

Playwright's sync API runs an event loop in the test thread; Django's ORM refuses to run
inside one unless told that is fine, which it is here (the loop is Playwright's, not ours).
Screenshots land in ``artifacts/screenshots`` (or SERVEBENCH_SCREENSHOTS) to look at.
With SERVEBENCH_UPDATE_SCREENSHOT=1, the tests that make the documentation's pictures
(``Page.docs_shot``) also write them into ``docs/`` (the README's is ``docs/screenshot-run.png``).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

REPO = Path(__file__).resolve().parents[3]
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


def screenshot_dir() -> Path:
    path = Path(os.environ.get("SERVEBENCH_SCREENSHOTS", REPO / "artifacts" / "screenshots"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def browser(need: Callable[..., None]) -> Iterator[Any]:
    exe = os.environ.get("SERVEBENCH_CHROMIUM") or shutil.which("chromium")
    need(exe, "Chromium", "run scripts/ensure-browser.sh (Debian: apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS, headless=True)
        yield chromium
        chromium.close()


class Page:
    """A browser page that records console errors and failed requests."""

    def __init__(self, page: Any, base_url: str):
        self.page = page
        self.base_url = base_url
        self.console_errors: list[str] = []
        page.on(
            "console",
            lambda msg: self.console_errors.append(msg.text) if msg.type == "error" else None,
        )
        page.on("pageerror", lambda exc: self.console_errors.append(str(exc)))

    def goto(self, path: str) -> Any:
        return self.page.goto(self.base_url + path)

    def wait_for(self, expression: str, timeout: float = 30_000) -> Any:
        """``page.wait_for_function`` for pages under our Content-Security-Policy: that
        one evaluates its predicate with eval() inside the page, which the policy refuses
        (as it should); ``evaluate`` goes through the DevTools protocol instead."""
        deadline = time.monotonic() + timeout / 1000
        while True:
            value = self.page.evaluate(f"() => {{ try {{ return {expression}; }} catch (e) {{}} }}")
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout / 1000:.0f} s: {expression}")
            time.sleep(0.1)

    def assert_fits(self) -> None:
        """The page is no wider than the window (no sideways scrolling at this width)."""
        overflow = self.page.evaluate(
            "document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert overflow <= 1, f"the page is {overflow} px wider than the window"

    def shot(self, name: str) -> Path:
        path = screenshot_dir() / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def docs_shot(self, name: str, height: int = 1474) -> Path | None:
        """With SERVEBENCH_UPDATE_SCREENSHOT=1, the top ``height`` pixels of the page as
        ``docs/<name>.png`` (a picture the documentation shows); otherwise nothing."""
        if os.environ.get("SERVEBENCH_UPDATE_SCREENSHOT") != "1":
            return None
        path = REPO / "docs" / f"{name}.png"
        width = self.page.viewport_size["width"]
        self.page.evaluate("window.scrollTo(0, 0)")
        self.page.screenshot(
            path=str(path), full_page=True, clip={"x": 0, "y": 0, "width": width, "height": height}
        )
        return path

    def sign_in(self, username: str, password: str) -> None:
        self.goto("/login/")
        self.page.fill("#id_username", username)
        self.page.fill("#id_password", password)
        self.page.click("main button[type=submit]")
        self.page.wait_for_url(lambda url: "/login/" not in url)
        self.page.wait_for_load_state()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.stash[_FAILED] = report.failed


_FAILED = pytest.StashKey[bool]()


@pytest.fixture
def page(browser: Any, live_server: Any, request: pytest.FixtureRequest) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    wrapped = Page(context.new_page(), live_server.url)
    yield wrapped
    if request.node.stash.get(_FAILED, False):
        # Keep what the browser showed when the test failed, next to the other screenshots.
        path = wrapped.shot(f"FAILED-{request.node.name}")
        print(f"screenshot of the failure: {path}\nURL: {wrapped.page.url}")
    context.close()
