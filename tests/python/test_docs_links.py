"""The README and docs/ hold together: every relative link resolves (file and anchor), every
docs page is in docs/SUMMARY.md and linked from the README, nothing points outside the
repository, and the README stays an entry page (at most 250 lines)."""

import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
PAGES = [os.path.join(ROOT, "README.md")] + DOCS
IDS = [os.path.relpath(p, ROOT) for p in PAGES]

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _text(path):
    return open(path, encoding="utf-8").read()


def _prose(text):
    """The text outside fenced code blocks (links are not parsed inside them)."""
    return re.sub(r"^\s*```.*?^\s*```", "", text, flags=re.S | re.M)


def _slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    s = heading.strip().lower()
    s = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", s)
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def _anchors(path):
    out, seen = set(), {}
    for line in _prose(_text(path)).splitlines():
        m = re.match(r"#{1,6} (.*)", line)
        if m:
            slug = _slug(m.group(1))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _links(path):
    return [m.group(1) for m in LINK.finditer(_prose(_text(path)))]


@pytest.mark.parametrize("path", PAGES, ids=IDS)
def test_relative_links_resolve(path):
    bad = []
    for target in _links(path):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
        if os.path.relpath(dest, ROOT).startswith(".."):
            bad.append(f"{target}: outside the repository")
        elif not os.path.exists(dest):
            bad.append(f"{target}: no such file")
        elif anchor and dest.endswith(".md") and anchor not in _anchors(dest):
            bad.append(f"{target}: no heading with anchor #{anchor} in {os.path.relpath(dest, ROOT)}")
    assert not bad, "\n".join(bad)


# What a user of the project never sees: the workspace around the repository, design notes
# outside it, and the numbers of the issues the work came from.
OUTSIDE = re.compile("|".join([
    r"\.\./shared", r"/work/shared", r"shared/(?:notes|anchors)", r"DESIGN\.md", r"/work/\.library",
    r"\b[Ii]ssues? #?\d+",
]))


def _tracked_text_files():
    import subprocess

    p = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip("not a git checkout")
    this = os.path.relpath(os.path.abspath(__file__), ROOT)
    for rel in p.stdout.split():
        if rel == this:
            continue
        try:
            yield rel, open(os.path.join(ROOT, rel), encoding="utf-8").read()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # binary files (plots, goldens of bytes)


def test_nothing_points_outside_the_repository():
    """No file of the project (docs, code, comments, tests, benchmarks) refers to files outside
    the repository or to issue numbers."""
    bad = [f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
           for rel, text in _tracked_text_files() for m in OUTSIDE.finditer(text)]
    assert not bad, "\n".join(bad)


def test_every_page_is_in_the_summary_and_the_readme():
    summary = os.path.join(ROOT, "docs", "SUMMARY.md")
    text = _text(summary)
    assert text.startswith("# Summary\n")
    listed = {os.path.normpath(os.path.join(ROOT, "docs", t.partition("#")[0])) for t in _links(summary)}
    readme = {os.path.normpath(os.path.join(ROOT, t.partition("#")[0])) for t in _links(os.path.join(ROOT, "README.md"))}
    pages = [p for p in DOCS if os.path.basename(p) != "SUMMARY.md"]
    assert [p for p in pages if p not in listed] == [], "pages missing from docs/SUMMARY.md"
    assert [p for p in pages + [summary] if p not in readme] == [], "pages not linked from README.md"
    # SUMMARY.md's entries are `- [Title](file.md)` lines (mdBook), under `#` part titles.
    for line in text.splitlines()[1:]:
        assert line == "" or line.startswith("# ") or re.fullmatch(r"\s*- \[[^\]]+\]\([\w.-]+\.md\)", line), line


def test_readme_is_short():
    with open(os.path.join(ROOT, "README.md")) as f:
        n = sum(1 for _ in f)
    assert n <= 250, f"README.md has {n} lines"
