"""Headless Chromium for the UI test: Debian's `chromium` package driven by Playwright for Python.

Playwright's own browser download (`playwright install`) does not work on the CI machines, so the test uses the
system browser at /usr/bin/chromium: the test setup installs it with apt when it runs as root (as on CI, where
`.ci/run` also installs it up front) and `.[test]` installs `playwright`. When either is still missing the test
fails (it does not skip) and says how to install it.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest

CHROMIUM = "/usr/bin/chromium"

# As root in a container without a display or a network beyond loopback: no sandbox, no GPU, and none of the
# background connections (component updates, sync, QUIC probes) that this machine's closed network refuses.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

INSTALL_HINT = ("install with `apt-get update && apt-get install -y chromium` and "
                "`.venv/bin/pip install -e '.[test]'` (which brings playwright; do not run `playwright install`, "
                "the test uses Debian's browser)")


def install_chromium() -> None:
    """The test setup installs Debian's browser when it is missing and this process may (root with apt-get)."""
    import shutil
    import subprocess

    if os.path.isfile(CHROMIUM) or os.geteuid() != 0 or shutil.which("apt-get") is None:
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update"], env=env, check=False, capture_output=True, timeout=900)
    subprocess.run(["apt-get", "install", "-y", "chromium"], env=env, check=False, capture_output=True, timeout=900)


def require_chromium() -> None:
    """Fail (not skip) the calling test when the browser or Playwright is missing (after trying to install it)."""
    install_chromium()
    missing = []
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        missing.append(f"Debian's chromium ({CHROMIUM} not found)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("Playwright for Python (`import playwright` failed)")
    if missing:
        pytest.fail("the Dagster UI browser test needs " + " and ".join(missing) + "; " + INSTALL_HINT, pytrace=False)


@contextmanager
def chromium_page(profile_dir: Path, timeout_ms: float = 60_000) -> Iterator[Any]:
    """A page in a fresh headless Chromium (new empty profile in `profile_dir`); the browser is closed on exit."""
    require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile_dir), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000})
        try:
            context.set_default_timeout(timeout_ms)
            yield context.pages[0] if context.pages else context.new_page()
        finally:
            context.close()
