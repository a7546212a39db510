#!/usr/bin/env python
"""Read the built book the way a reader does: every page in headless Chromium, from a file path.

For each page of ``_toc.yml`` it reports what a reader would trip over, and saves a screenshot
of the whole page:

* an error or a traceback in a cell's output;
* a reference, term or citation that did not resolve, or a role left as raw text;
* a figure that does not load;
* a cell with more than ``MAX_OUTPUT_BOXES`` output boxes;
* code or output wider than the content column (at ``WIDTH`` px: 100 characters fit);
* a temporary path in the text, a link that leaves the site's folder or points nowhere, and a
  script or style sheet fetched from the network (the site must work offline).

It also checks that the search page, opened from the file system, finds a term.

    python scripts/browse_book.py _build            # what `make book` runs: _build/screenshots
    python scripts/browse_book.py /tmp/book/_build  # any build

Needs Debian's ``chromium`` and ``chromium-driver`` (scripts/setup.sh installs them as root)
and selenium (requirements.txt). Exit status: 0 all pages clean, 1 problems (listed), 3 no
browser here (nothing checked).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

import yaml

REPO = Path(__file__).resolve().parents[1]
WIDTH, HEIGHT = 1280, 900
MAX_OUTPUT_BOXES = 3
MAX_SCREENSHOT_HEIGHT = 16000
SEARCH_TERM = "allreduce"

# One call per page: everything the checks need, measured by the browser itself.
INSPECT = r"""
const main = document.querySelector('main') || document.body;
const text = main.innerText;
const out = {text: text, problems: []};
const add = (kind, detail) => out.problems.push([kind, String(detail).slice(0, 160)]);
for (const o of main.querySelectorAll('.cell_output .output')) {
  if (o.matches('.traceback, .error') || /Traceback \(most recent call last\)/.test(o.innerText))
    add('error output', o.innerText.split('\n').slice(-2).join(' '));
}
for (const x of main.querySelectorAll('.xref, .problematic, .system-message')) {
  if (!x.closest('a')) add('unresolved reference', x.innerText);
}
for (const m of text.matchAll(/\{(cite|term|doc|ref|glue:text|glue)\}`[^`]*`|\[\?\]/g))
  add('role left as text', m[0]);
for (const img of main.querySelectorAll('img')) {
  if (!img.complete || img.naturalWidth === 0) add('figure does not load', img.getAttribute('src'));
}
main.querySelectorAll('div.cell').forEach((cell, i) => {
  const boxes = cell.querySelectorAll(':scope > .cell_output > .output').length;
  if (boxes > %(max_boxes)d) add('too many output boxes', `cell ${i}: ${boxes}`);
});
for (const pre of main.querySelectorAll('pre')) {
  if (pre.scrollWidth > pre.clientWidth + 1) {
    const where = pre.closest('.cell_output') ? 'output' : pre.closest('.cell_input') ? 'code cell' : 'code block';
    const longest = pre.innerText.split('\n').reduce((a, b) => b.length > a.length ? b : a, '');
    add('wider than the column', `${where} (${pre.scrollWidth} > ${pre.clientWidth} px): ${longest.trim()}`);
  }
}
for (const s of document.querySelectorAll('script[src], link[rel=stylesheet][href]')) {
  const url = s.getAttribute('src') || s.getAttribute('href');
  if (/^(https?:)?\/\//.test(url)) add('fetched from the network', url);
}
out.links = Array.from(document.querySelectorAll('a[href]'), a => a.getAttribute('href'));
out.height = Math.max(document.body.scrollHeight, document.documentElement.scrollHeight);
return out;
""" % {"max_boxes": MAX_OUTPUT_BOXES}


def toc_pages(root: Path = REPO) -> list[str]:
    """The book's pages in reading order, as paths of their HTML files under ``html/``."""
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    parts = toc.get("parts", []) or [{"chapters": toc.get("chapters", [])}]
    files = [toc["root"], *(ch["file"] for part in parts for ch in part.get("chapters", []))]
    return [f"{f}.html" for f in files]


def have_browser() -> str | None:
    """None when Chromium and its driver are here; otherwise what to install."""
    missing = [p for p, exe in (("chromium", "chromium"), ("chromium-driver", "chromedriver")) if not shutil.which(exe)]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip, requirements.txt)")
    return f"missing {', '.join(missing)} (scripts/setup.sh installs them)" if missing else None


def start_browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--allow-file-access-from-files", f"--window-size={WIDTH},{HEIGHT}", "--hide-scrollbars"):
        options.add_argument(arg)
    options.binary_location = shutil.which("chromium")
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


def _load(driver, url: str) -> None:
    driver.get(url)
    deadline = time.monotonic() + 20
    while driver.execute_script("return document.readyState") != "complete" and time.monotonic() < deadline:
        time.sleep(0.05)


def _link_problems(html: Path, page: Path, links: list[str]) -> list[tuple[str, str]]:
    """Links must stay inside the site, be relative, and point at files that exist."""
    problems = []
    for href in links:
        url = urlparse(href)
        if url.scheme in ("http", "https", "mailto") or href.startswith("#"):
            continue
        if url.scheme or href.startswith("/"):
            problems.append(("link not relative", href))
            continue
        target = (page.parent / unquote(url.path)).resolve()
        if html.resolve() not in target.parents and target != html.resolve():
            problems.append(("link leaves the site", href))
        elif not target.exists():
            problems.append(("broken link", href))
    return problems


def check_page(driver, html: Path, name: str, screenshots: Path | None = None) -> list[tuple[str, str]]:
    """The problems a reader would meet on one page; a full-page screenshot on the way."""
    page = html / name
    _load(driver, page.as_uri())
    seen = driver.execute_script(INSPECT)
    problems = [tuple(p) for p in seen["problems"]]
    if "/tmp/" in seen["text"]:
        line = next(ln for ln in seen["text"].splitlines() if "/tmp/" in ln)
        problems.append(("temporary path in the text", line.strip()[:160]))
    problems += _link_problems(html, page, seen["links"])
    if screenshots is not None:
        screenshots.mkdir(parents=True, exist_ok=True)
        driver.set_window_size(WIDTH, min(max(seen["height"], HEIGHT), MAX_SCREENSHOT_HEIGHT))
        time.sleep(0.2)  # let the layout settle at the new height
        driver.save_screenshot(str(screenshots / (name.replace("/", "__").removesuffix(".html") + ".png")))
        driver.set_window_size(WIDTH, HEIGHT)
    return problems


def search_finds(driver, html: Path, term: str = SEARCH_TERM) -> list[str]:
    """The titles of the pages the site's own search lists for ``term``, opened from files."""
    _load(driver, (html / "search.html").as_uri() + f"?q={term}")
    deadline = time.monotonic() + 20
    found: list[str] = []
    while time.monotonic() < deadline and not found:
        time.sleep(0.2)
        found = driver.execute_script(
            "return Array.from(document.querySelectorAll('#search-results li a'), a => a.innerText.trim())"
            ".filter(t => t);")
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("build", type=Path, help="the _build folder (with html/ in it)")
    p.add_argument("--screenshots", type=Path, help="where the screenshots go (default: BUILD/screenshots)")
    args = p.parse_args(argv)
    args.build = args.build.resolve()  # file:// URIs need an absolute path (make book passes _build)
    html = args.build / "html"
    why = have_browser()
    if why:
        print(f"[browse] not checked in a browser: {why}")
        return 3
    shots = args.screenshots or args.build / "screenshots"
    driver = start_browser()
    failed = 0
    try:
        for name in toc_pages():
            problems = check_page(driver, html, name, shots)
            failed += bool(problems)
            for kind, detail in problems:
                print(f"[browse] {name}: {kind}: {detail}")
        hits = search_finds(driver, html)
        if not hits:
            failed += 1
            print(f"[browse] search.html: searching for {SEARCH_TERM!r} from the file system found nothing")
    finally:
        driver.quit()
    print(f"[browse] {len(toc_pages())} pages read in Chromium at {WIDTH} px; screenshots in {shots}; "
          f"{'problems on ' + str(failed) + ' page(s)' if failed else 'no problems'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
