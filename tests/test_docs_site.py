"""The documentation site builds as `make docs` builds it (mkdocs build --strict: a broken link, anchor, snippet or
API reference stops it), and works in a browser: headless Chromium (tests/_browser.py, the report's render test's
browser) driven by Playwright opens the built site over HTTP and follows the navigation, searches, and reads an API
page, with no script error on the way."""

from __future__ import annotations

import functools
import http.server
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests._browser import chromium

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ | {"NO_MKDOCS_2_WARNING": "1"},
    )
    assert build.returncode == 0, f"mkdocs build --strict failed:\n{build.stdout[-4000:]}{build.stderr[-4000:]}"
    return out


def test_make_docs_builds_the_same_site():
    """`make docs` is the command the test runs (mkdocs build --strict), and the Makefile's venv installs its extra."""
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^docs: \$\(VENV\)/\.installed\n\t.*\$\(VENV\)/bin/mkdocs build --strict", makefile, re.M)
    assert re.search(r"^\t\$\(PIP\) install -e '\.\[[^\]]*\bdocs\b[^\]]*\]'", makefile, re.M)


def test_every_page_of_the_nav_is_built(site):
    import yaml

    def pages(nav) -> list[str]:
        found = []
        for item in nav:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            found += pages(value) if isinstance(value, list) else [value]
        return found

    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    listed = pages(config["nav"])
    assert "api/index.md" in listed and "changelog.md" in listed and len(listed) >= 25
    missing = [p for p in listed if not (site / p.replace(".md", ".html")).is_file()]
    assert not missing, f"nav pages not built: {missing}"


@pytest.fixture(scope="module")
def served(site):
    handler = functools.partial(QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    executable = chromium()
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=executable, args=["--no-sandbox", "--disable-gpu"])
        yield launched
        launched.close()


def test_navigation_search_and_an_api_page_work_in_chromium(served, browser):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("requestfailed", lambda r: errors.append(f"{r.url}: {r.failure}"))  # the site fetches nothing elsewhere

    # the home page and its navigation: every job has a nav link, and one leads to its page
    page.goto(f"{served}/index.html")
    assert page.locator("h1").first.inner_text().rstrip("¶") == "ctxrep"
    nav = page.locator("nav.md-nav--primary")
    for job in ("Featurize", "Analyse", "Fine-tune", "Retrieval and reranking", "Serve and scale", "Compress"):
        assert nav.get_by_role("link", name=job, exact=True).count() >= 1, f"no nav link {job!r}"
    nav.get_by_role("link", name="Retrieval and reranking", exact=True).first.click()
    page.wait_for_url("**/retrieval.html")
    assert page.locator("h1").first.inner_text().rstrip("¶") == "Retrieval and reranking"

    # search: the index loads in its worker and answers with the page that holds the word
    search = page.locator("input.md-search__input")
    search.click()
    results = page.locator(".md-search-result__item a")
    deadline = time.monotonic() + 180  # the search worker indexes the whole site first: slow on a busy machine
    while True:  # the query typed again until the worker answers it: one typed before the index is ready can be lost
        search.fill("")
        search.fill("late chunking")
        try:
            results.first.wait_for(timeout=10_000)
            break
        except PlaywrightTimeout:
            if time.monotonic() > deadline:
                raise
    hrefs = [results.nth(i).get_attribute("href") for i in range(results.count())]
    assert any("retrieval.html" in (h or "") for h in hrefs), hrefs

    # an API page: the class, its method and the docstring text, generated from the source
    page.goto(f"{served}/api/search.html")
    assert page.locator("[id='ctxrep.vectors.index.SentenceIndex']").count() == 1
    assert page.locator("[id='ctxrep.vectors.index.SentenceIndex.search']").count() == 1
    assert "The k nearest items of each query" in page.locator("article").inner_text()
    page.get_by_role("link", name="Task models").first.click()
    page.wait_for_url("**/api/tasks.html")
    assert page.locator("[id='ctxrep.tasks.classifier.SequenceClassifier']").count() == 1
    assert not errors, f"script errors on the site: {errors}"
