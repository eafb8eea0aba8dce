"""Facts the code relies on live in docs/facts.md, cited by anchor: every cited anchor exists, and nothing cites the
notes that were never part of the repository."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FACTS = ROOT / "docs" / "facts.md"
CITATION = re.compile(r"docs/facts\.md#([A-Za-z0-9_-]+)")
RETIRED = re.compile(r"(?<![\w-])reference\.md")  # not docs/tunedmodel-reference.md, which is ours
TEXT_SUFFIXES = (".py", ".md", ".yaml", ".yml", ".sh", ".toml", ".txt")


def repository_texts() -> Iterator[tuple[Path, str]]:
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [d for d in subfolders if not d.startswith(".") and not d.endswith(".egg-info")
                         and d not in ("node_modules", "__pycache__")]
        for name in files:
            if name.endswith(TEXT_SUFFIXES):
                path = Path(folder) / name
                yield path.relative_to(ROOT), path.read_text(errors="replace")


def anchors() -> set[str]:
    return set(re.findall(r'<a id="([^"]+)"></a>', FACTS.read_text()))


def test_every_cited_fact_has_its_section() -> None:
    missing = [(str(path), anchor) for path, text in repository_texts() for anchor in CITATION.findall(text)
               if anchor not in anchors()]
    assert missing == []


def test_the_code_cites_facts_in_the_repository_only() -> None:
    citing = [str(path) for path, text in repository_texts() if RETIRED.search(text)]
    assert citing == [], "cite the section of docs/facts.md, by its anchor, instead"


def test_every_section_has_an_anchor_and_cites_sources() -> None:
    sections = re.split(r'\n<a id="[^"]+"></a>\n## ', FACTS.read_text())[1:]
    assert len(sections) == len(anchors()) >= 10
    assert all("Sources:" in section for section in sections)
