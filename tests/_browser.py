"""The headless Chromium that the browser tests use (the report's render check, the documentation site): Debian's
chromium, installed with apt-get when it is missing. A user's machine may lack it with no apt to get one: the tests
that need it skip there, saying what to install. CI can install one, so a missing browser there is a failure and
the browser tests never silently stop running."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def no_browser(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"CI must be able to run a headless Chromium: {reason}")
    pytest.skip(f"this test needs a headless Chromium: {reason}; install chromium to run it")


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
