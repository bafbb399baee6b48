#!/usr/bin/env python3
"""The user documents, checked: `.ci/run` fails when a check fails.

1. Links: every internal link and anchor in the built book (`target/book`,
   from `mdbook build docs`) resolves: an `href`/`src` names a file that
   exists, and its `#fragment` an `id` in that file. External links
   (http, https, mailto, ...) are not fetched.
2. Bookkeeping: README.md and docs/src/**/*.md describe what is, not how
   it came to be: no issue numbers, no before/after of earlier versions, no
   "was N" or "from N to M" figures, no `N → M` moves of a figure, no
   "Unreleased" or release-notes section (those live in CHANGELOG.md and
   benches/RESULTS.md).

Prints each failure as `file:line: rule: text` and exits 1; prints a
summary and exits 0 otherwise. Every run first checks the rules against
their own cases (`--self-test` runs only those). Python 3 standard library
only.
"""

from __future__ import annotations

import html
import re
import sys
import tempfile
import urllib.parse
from html.parser import HTMLParser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "target" / "book"

# --- bookkeeping -------------------------------------------------------------

FIGURE = r"~?\d[\d,]*(?:\.\d+)?"
ABOUT = r"(?:(?:about|around|roughly|some)\s+)?"
UNIT = r"(?:\s*(?:%|×|x|[a-zA-Zµ]{1,4}\b))?"

# (rule name, pattern, why). Each pattern is searched in the whole text, so a figure broken
# over two lines is still found; a failure is reported at the line its match starts on.
RULES: list[tuple[str, re.Pattern[str], str]] = [
    (
        "issue-number",
        re.compile(r"\b[Ii]ssues?\s+#?\d+\b"),
        "an issue number is project bookkeeping",
    ),
    (
        "issue-number",
        re.compile(r"(?<![\w&/#])#\d+\b(?![\w-])"),
        "an issue reference (#N) is project bookkeeping",
    ),
    (
        "before-after",
        re.compile(
            r"\bbefore\s*/\s*after\b|\((?:before|after)\)|\b(?:before|after)\s*[:=]\s*~?\d"
            r"|\b(?:previous|earlier|older|prior)\s+(?:versions?|releases?|builds?)\b"
            r"|\bpreviously\b|\bused to be\b",
            re.I,
        ),
        "a before/after of earlier versions belongs in CHANGELOG.md",
    ),
    (
        "was-figure",
        re.compile(r"\b(?:was|were)\s+(?:only\s+)?" + ABOUT + FIGURE + r"(?!\w)", re.I),
        'a "was N" figure is history, say what it is',
    ),
    (
        "from-to-figure",
        re.compile(
            r"\bfrom\s+" + ABOUT + FIGURE + UNIT + r"\s+(?:down\s+|up\s+)?to\s+" + ABOUT + FIGURE
            + r"|\b(?:rose|fell|dropped|grew|shrank|climbed|improved|regressed|sped up|slowed)\s+"
            r"(?:by\s+|from\s+)?" + ABOUT + FIGURE,
            re.I,
        ),
        'a "from N to M" figure is a move, say what it is',
    ),
    (
        "figure-move",
        re.compile(FIGURE + UNIT + r"\s*(?:→|->|⟶|=>)\s*" + FIGURE),
        "an N → M move of a figure is history, give the current figure",
    ),
    (
        "unreleased",
        re.compile(r"\bUnreleased\b"),
        '"Unreleased" is release history, it belongs in CHANGELOG.md',
    ),
    (
        "release-notes",
        re.compile(r"^#{1,6}[ \t]+(?:Release notes|Changelog|Change log|History)\b", re.I | re.M),
        "release history belongs in CHANGELOG.md",
    ),
]


def bookkeeping(path: str, text: str) -> list[str]:
    """Each line of `text` that breaks a rule, as `path:line: rule: text`."""
    found: dict[tuple[int, str], str] = {}
    for name, pattern, why in RULES:
        for m in pattern.finditer(text):
            number = text.count("\n", 0, m.start()) + 1
            shown = " ".join(m.group(0).split())
            found.setdefault((number, name), f"{path}:{number}: {name}: {shown!r} ({why})")
    return [found[key] for key in sorted(found)]


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs" / "src").rglob("*.md"))]


# --- links -------------------------------------------------------------------


class Page(HTMLParser):
    """One built page: the ids it defines and the links it holds."""

    LINKS = {"a": "href", "link": "href", "img": "src", "script": "src", "iframe": "src",
             "source": "src", "object": "data", "embed": "src", "use": "href"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[tuple[int, str]] = []
        self.base: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        for key in ("id", "name") if tag == "a" else ("id",):
            if values.get(key):
                self.ids.add(values[key] or "")
        if tag == "base" and values.get("href"):
            self.base = values["href"]
        attr = self.LINKS.get(tag)
        target = values.get(attr or "") or (values.get("xlink:href") if tag == "use" else None)
        if attr and target:
            self.links.append((self.getpos()[0], target))

    handle_startendtag = handle_starttag


EXTERNAL = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:|//)")


def parse(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text(errors="replace"))
    page.close()
    return page


def svg_ids(path: Path) -> set[str]:
    return set(re.findall(r'\bid="([^"]+)"', path.read_text(errors="replace")))


def links(book: Path) -> list[str]:
    """Each internal link of the built book that does not resolve."""
    book = book.resolve()
    pages = {p: parse(p) for p in sorted(book.rglob("*.html"))}
    failures = []
    for path, page in pages.items():
        shown = path.relative_to(book)
        for line, raw in page.links:
            target = html.unescape(raw).strip()
            if not target or EXTERNAL.match(target):
                continue
            base_dir = path.parent
            if page.base and not EXTERNAL.match(page.base):
                base_dir = book / page.base.lstrip("/") if page.base.startswith("/") else path.parent / page.base
            ref, _, fragment = target.partition("#")
            ref = urllib.parse.unquote(ref.split("?", 1)[0])
            if not ref:
                dest = path
            elif ref.startswith("/"):
                dest = book / ref.lstrip("/")
            else:
                dest = base_dir / ref
            dest = dest.resolve()
            if dest.is_dir():
                dest = dest / "index.html"
            if not dest.is_file():
                failures.append(f"{book.name}/{shown}:{line}: broken-link: {raw} (no file {dest})")
                continue
            if not fragment:
                continue
            fragment = urllib.parse.unquote(fragment)
            if dest.suffix == ".html":
                known = pages[dest].ids if dest in pages else parse(dest).ids
            elif dest.suffix == ".svg":
                known = svg_ids(dest)
            else:
                continue
            if fragment not in known:
                failures.append(f"{book.name}/{shown}:{line}: broken-anchor: {raw} (no id {fragment!r} in {dest.name})")
    return failures


def readme_links(readme: Path, book: Path) -> list[str]:
    """README.md's relative links: each names a file of the repository, and
    an anchor into a page of the book names an id of that page as built."""
    failures = []
    src = ROOT / "docs" / "src"
    for number, line in enumerate(readme.read_text().splitlines(), 1):
        for target in re.findall(r"\]\(([^)\s]+)\)", line):
            if EXTERNAL.match(target):
                continue
            ref, _, fragment = target.partition("#")
            dest = (readme.parent / ref).resolve() if ref else readme
            if not dest.exists():
                failures.append(f"README.md:{number}: broken-link: {target} (no file {dest})")
                continue
            if not fragment:
                continue
            try:
                page = dest.relative_to(src.resolve())
            except ValueError:
                continue
            built = book / page.with_suffix(".html")
            if page.name == "index.md":
                built = book / page.parent / "index.html"
            if not built.is_file() or fragment not in parse(built).ids:
                failures.append(f"README.md:{number}: broken-anchor: {target} (no id {fragment!r} in {built})")
    return failures


# --- the rules' own cases ----------------------------------------------------

# (rule, a line that must fail it, a line that must pass every rule)
CASES: list[tuple[str, str, str]] = [
    ("issue-number", "Issue 16's goals, met:", "The issue a user hits most is a missing key."),
    ("issue-number", "as issue 12 asked, every bound is checked", "See the tissue 12 sample (no)."),
    ("issue-number", "fixed in #16", "Anchors such as page.md#16 and `&#16;` are not issues; # 16 threads"),
    ("before-after", "| step p50 | before/after |", "Stop it before the process exits; after the flush it ends."),
    ("before-after", "before: 11.2 ms", "The worker starts before the first webhook arrives."),
    ("before-after", "Unlike previous versions, it retries", "Each version of a memory is kept."),
    ("was-figure", "The binary was 29.8 MB", "The binary is 21.6 MB, which was measured on an idle machine."),
    ("from-to-figure", "p50 went from 0.73 to 0.42 ms", "Ports may be any value between 1 and 65535."),
    ("from-to-figure", "cut from 1.2 s down to 0.4 s", "From the webhook to the first result, 0.4 s pass."),
    ("from-to-figure", "The peak RSS rose from about 9.5 to 12.5 MiB", "The peak RSS is 12.5 MiB."),
    ("from-to-figure", "the binary grew by 0.8 MB", "A store grows by one version per edit burst."),
    ("figure-move", "step p50 11.2 → 5.4 ms", "webhook → drain → item → teardown"),
    ("figure-move", "binary 29.8 → 21.6 MB", "observe → plan → execute → commit, 3 passes"),
    ("figure-move", "RSS 18.6 MiB -> 15.2 MiB", "fn main() -> Result<(), Error> returns 0"),
    ("unreleased", "### Unreleased", "Released builds are static binaries."),
    ("release-notes", "## Release notes", "## Releasing a build"),
]

LINK_CASES_HTML = {
    "index.html": '<a href="a.html">a</a><a href="a.html#here">x</a><a href="#top">t</a><h1 id="top">T</h1>'
                  '<a href="https://example.com/#nowhere">e</a><a href="mailto:x@y">m</a><img src="pic.svg">',
    "a.html": '<h2 id="here">Here</h2><a href="sub/">dir</a><a href="index.html#top">back</a>',
    "sub/index.html": '<a href="../a.html">up</a><a href="/a.html#here">root</a>',
    "pic.svg": '<svg xmlns="http://www.w3.org/2000/svg"><g id="g1"/></svg>',
}
# Each must be reported (one failure each) when added to the book above.
LINK_FAILURES = [
    '<a href="missing.html">gone</a>',
    '<a href="a.html#not-there">bad anchor</a>',
    '<a href="#nope">bad own anchor</a>',
    '<img src="images/none.svg">',
    '<a href="pic.svg#g2">bad svg id</a>',
]


def self_test() -> list[str]:
    """The rules against their cases: each failing line fails its rule, each
    passing line passes every rule; the link check finds each broken link
    and nothing in a sound book."""
    problems = []
    for rule, bad, good in CASES:
        found = bookkeeping("case", bad)
        if not any(f": {rule}: " in f for f in found):
            problems.append(f"self-test: {rule} does not catch {bad!r} (got {found})")
        if found := bookkeeping("case", good):
            problems.append(f"self-test: {good!r} should pass, got {found}")
    for rule, _, _ in RULES:
        if not any(case[0] == rule for case in CASES):
            problems.append(f"self-test: rule {rule} has no case")
    with tempfile.TemporaryDirectory() as tmp:
        book = Path(tmp) / "book"
        for name, text in LINK_CASES_HTML.items():
            (book / name).parent.mkdir(parents=True, exist_ok=True)
            (book / name).write_text(text)
        if found := links(book):
            problems.append(f"self-test: a sound book fails the link check: {found}")
        for bad in LINK_FAILURES:
            (book / "bad.html").write_text(bad)
            found = links(book)
            if len(found) != 1:
                problems.append(f"self-test: {bad!r} gives {found}, not one failure")
    return problems


def main(argv: list[str]) -> int:
    problems = self_test()
    if "--self-test" in argv:
        for p in problems:
            print(p)
        print(f"check_docs self-test: {len(CASES)} rule cases, {len(LINK_FAILURES)} link cases"
              + (f", {len(problems)} problems" if problems else ", all as expected"))
        return 1 if problems else 0
    if not BOOK.is_dir():
        problems.append(f"{BOOK} is missing: run `mdbook build docs` first")
    else:
        problems += links(BOOK)
        problems += readme_links(ROOT / "README.md", BOOK)
    docs = documents()
    for doc in docs:
        problems += bookkeeping(str(doc.relative_to(ROOT)), doc.read_text())
    for p in problems:
        print(p)
    pages = len(list(BOOK.rglob("*.html"))) if BOOK.is_dir() else 0
    print(f"check_docs: {pages} built pages, {len(docs)} documents, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
