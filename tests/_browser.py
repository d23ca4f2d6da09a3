"""The headless Chromium that the browser tests use (the report's render check, the documentation site): Debian's
chromium, installed with apt-get when it is missing. Without one the browser tests fail, saying what to install; a
user whose machine cannot have one skips them by saying so (CTXREP_SKIP_BROWSER_TESTS=1), never silently. CI
(.ci/run sets CI=1) never skips them."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def no_browser(reason: str) -> None:
    if os.environ.get("CTXREP_SKIP_BROWSER_TESTS") == "1" and not os.environ.get("CI"):
        pytest.skip(f"CTXREP_SKIP_BROWSER_TESTS=1: the headless-Chromium tests are skipped as asked ({reason})")
    pytest.fail(
        f"this test needs a headless Chromium: {reason}; install chromium (apt-get install chromium), or set "
        "CTXREP_SKIP_BROWSER_TESTS=1 to skip the browser tests on a machine that cannot have one"
    )


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    try:
        subprocess.run(["apt-get", "install", "-y", "-q", "chromium"], check=True, capture_output=True, timeout=900)
    except (OSError, subprocess.SubprocessError) as e:
        no_browser(f"Debian's chromium is not installed and could not be installed ({type(e).__name__}: {e})")
    found = shutil.which("chromium")
    if not found:
        no_browser("apt-get install chromium succeeded but no chromium binary is on PATH")
    return found
