"""Code and docs cite only documents that are in the repository: the design lives in docs/, so a newcomer can open
every document a module or page points to. A citation is a `*.md` path in a source file, a test, a script or a
markdown page; it must name a tracked file, relative to the repository root or to the citing file, or, written as a
bare name (`README.md`), a tracked file of that name. Links to the web are not citations of the repository.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()  # its own examples of dangling citations
CITING = ("operator", "gpu_runtime", "tests", "bench", "hack", "docs", "deploy", "examples", "README.md")
# Not documents of this repository, each named with its source where it is cited.
ELSEWHERE = {
    "report.md": "the report local mode writes at run time (runs/<name>/report.md)",
    "runs/local-tiny/report.md": "the report `make demo` writes",
    "docs/gguf.md": "the GGUF specification in github.com/ggml-org/ggml (docs/facts.md cites it as a source)",
    "tools/server/README.md": "llama.cpp's server documentation (docs/facts.md cites it as a source)",
}
CITATION = re.compile(r"(?<![\w/.:-])((?:\.{1,2}/|[\w-]+/)*[\w.-]+\.md)\b")


def _tracked() -> list[str]:
    found = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", *CITING], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    return [f for f in found if (ROOT / f).is_file()]


def _missing(citing: str, cited: str, tracked: set[str], names: set[str]) -> bool:
    if "/" not in cited:
        return cited not in names
    here = (ROOT / citing).parent
    return not any(p.resolve().relative_to(ROOT).as_posix() in tracked
                   for p in (ROOT / cited, here / cited) if p.resolve().is_relative_to(ROOT))


def dangling(files: list[str]) -> list[str]:
    tracked = set(files)
    names = {Path(f).name for f in files}
    found = []
    for name in files:
        if not name.endswith((".py", ".md", ".yaml", ".yml", ".sh", ".toml")) or name == SELF:
            continue
        for number, line in enumerate((ROOT / name).read_text(errors="replace").splitlines(), 1):
            for cited in CITATION.findall(line):
                if cited not in ELSEWHERE and _missing(name, cited, tracked, names):
                    found.append(f"{name}:{number}: {cited}")
    return found


def test_every_cited_document_is_in_the_repository() -> None:
    assert dangling(_tracked()) == []


def test_the_checker_sees_a_document_outside_the_repository() -> None:
    assert _missing("operator/slotune/policy/remedies.py", "DESIGN.md", set(), {"README.md"})
    assert _missing("docs/architecture.md", "../shared/DESIGN.md", {"docs/architecture.md"}, set())
    assert not _missing("docs/architecture.md", "tuning-rules.md", set(), {"tuning-rules.md"})
    assert not _missing("docs/architecture.md", "tuning-rules.md", {"docs/tuning-rules.md"}, {"tuning-rules.md"})
