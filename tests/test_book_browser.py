"""The built book in a real browser: every page read by headless Chromium from a file path,
as a reader who downloaded the site would open it (scripts/browse_book.py does the reading).

Screenshots of every page go to ``<the session's build>/_build/screenshots`` (printed below;
``make book`` writes them to ``_build/screenshots``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import browse_book  # noqa: E402

pytestmark = [pytest.mark.book, pytest.mark.slow, pytest.mark.notebooks,
              pytest.mark.skipif(browse_book.have_browser() is not None,
                                 reason=f"no browser: {browse_book.have_browser()}")]
PAGES = browse_book.toc_pages()


@pytest.fixture(scope="module")
def browser():
    driver = browse_book.start_browser()
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def screenshots(built_book) -> Path:
    folder = built_book / "screenshots"
    print(f"\nscreenshots of the book's pages: {folder}")
    return folder


@pytest.mark.parametrize("page", PAGES)
def test_a_reader_meets_no_problem_on(page, built_book, browser, screenshots):
    problems = browse_book.check_page(browser, built_book / "html", page, screenshots)
    assert not problems, f"{page}:\n" + "\n".join(f"  {kind}: {detail}" for kind, detail in problems)
    assert (screenshots / (page.replace("/", "__").removesuffix(".html") + ".png")).stat().st_size > 10_000


def test_the_site_works_from_a_file_path(built_book, browser):
    """Offline and without a server: the front page leads into the book through relative links,
    and the search page, opened from the file system, finds a term."""
    html = built_book / "html"
    browse_book._load(browser, (html / "index.html").as_uri())
    assert browser.current_url.endswith("book/intro.html"), browser.current_url
    link = browser.execute_script(
        "return Array.from(document.querySelectorAll('nav a.reference.internal'))"
        ".map(a => a.href).find(h => h.includes('01_single_gpu_baseline'));")
    assert link and link.startswith("file://"), link
    browse_book._load(browser, link)
    assert "The single-GPU baseline" in browser.title
    found = browse_book.search_finds(browser, html, "allreduce")
    assert "Glossary" in found, f"searching 'allreduce' from the file system found {found}"


def test_the_checks_catch_what_they_should(tmp_path, browser):
    """A page with each defect: the checks must see every one (a check that cannot fail is none)."""
    html = tmp_path / "html"
    html.mkdir()
    (html / "bad.html").write_text(
        "<html><body><main>"
        "<div class='cell'><div class='cell_output'>"
        + "<div class='output stream'><pre>x</pre></div>" * 4
        + "<div class='output traceback'><pre>Traceback (most recent call last):\nValueError</pre></div>"
        "</div></div>"
        "<pre>" + "y" * 400 + "</pre>"
        "<img src='missing.png'><p>see {cite}`thesis` in /tmp/guide-01-x</p>"
        "<a href='nowhere.html'>x</a><a href='/abs.html'>y</a>"
        "</main></body></html>")
    kinds = {kind for kind, _ in browse_book.check_page(browser, html, "bad.html")}
    assert kinds >= {"error output", "too many output boxes", "wider than the column", "figure does not load",
                     "role left as text", "temporary path in the text", "broken link", "link not relative"}
