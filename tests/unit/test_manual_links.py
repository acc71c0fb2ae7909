"""The manual's pages hold together: every link between them leads to a page that exists and, where
it names one, to a heading of that page (by GitHub's anchors), and the front page links every page."""

from __future__ import annotations

from readme import PAGES, README, anchor, headings, links, page_name


def anchors(text: str) -> set[str]:
    """Every anchor of a page: a heading's, and GitHub's ``-1``, ``-2``, ... for its repeats."""
    found: set[str] = set()
    for _, title in headings(text):
        name = anchor(title)
        repeat = 0
        while (name if repeat == 0 else f"{name}-{repeat}") in found:
            repeat += 1
        found.add(name if repeat == 0 else f"{name}-{repeat}")
    return found


def test_every_link_leads_to_a_page_and_a_heading() -> None:
    broken = []
    for page in PAGES:
        for path, fragment in links(page.read_text()):
            target = (page.parent / path).resolve() if path else page
            if not target.exists():
                broken.append(f"{page_name(page)}: {path} does not exist")
            elif fragment and (target.suffix != ".md" or fragment not in anchors(target.read_text())):
                broken.append(f"{page_name(page)}: {path or page.name} has no heading #{fragment}")
    assert broken == []


def test_the_front_page_links_every_page() -> None:
    linked = {(README.parent / path).resolve() for path, _ in links(README.read_text()) if path}
    assert [page_name(page) for page in PAGES[1:] if page.resolve() not in linked] == []


def test_anchors_follow_github() -> None:
    assert anchor("XLA:GPU (torch_xla 2.2 to 2.8)") == "xlagpu-torch_xla-22-to-28"
    assert anchor("Hangs, stacks and memory") == "hangs-stacks-and-memory"
    assert anchors("# A\n\n```\n# not a heading\n```\n## A\n") == {"a", "a-1"}
