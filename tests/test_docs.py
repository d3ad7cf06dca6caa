"""The README and docs/ stay a guide whose links lead somewhere."""

import re
from pathlib import Path

import pytest

from conftest import REPO

DOCS = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
README_LINES = 250


def anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    found = set()
    for line in markdown.splitlines():
        heading = re.match(r"#{1,6} (.+)", line)
        if heading:
            text = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower())
            found.add(text.replace(" ", "-"))
    return found


def local_links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return [link for link in LINK.findall(text) if not re.match(r"[a-z]+:", link)]


def broken_links(path: Path) -> list[str]:
    broken = []
    for link in local_links(path):
        target, _, anchor = link.partition("#")
        file = (path.parent / target).resolve() if target else path
        if not file.exists():
            broken.append(link)
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
            broken.append(link)
    return broken


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_local_link_leads_somewhere(path):
    assert broken_links(path) == []


def test_a_broken_link_or_anchor_is_found(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## Is there a rise?\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#is-there-a-rise) [gone](missing.md) [bad](other.md#no-such) "
        "[web](https://example.com) [self](#page)\n\n# Page\n"
    )
    assert broken_links(page) == ["missing.md", "other.md#no-such"]


def test_readme_is_a_guide_that_links_every_doc():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= README_LINES
    linked = {link.partition("#")[0] for link in local_links(REPO / "README.md")}
    assert {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")} <= linked
