"""Every "design §x" cited in the code, the tests and the docs names a section of docs/design.md."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"
SEARCHED = ("src", "tests", "bench", "examples", "docs", "README.md")
SUFFIXES = {".py", ".pyx", ".pyi", ".pxd", ".proto", ".h", ".c", ".md"}

NUMBER = r"\d+(?:\.\d+)*"
# "design §2.9", "design.md §3", "design §2.3-2.5" (or an en dash), "design §2.5, §2.8"
DASH = "-\u2013"
CITATION = re.compile(rf"design(?:\.md)? §({NUMBER})((?:\s*[{DASH}]\s*{NUMBER})?)((?:,\s*§{NUMBER})*)", re.I)
HEADING = re.compile(rf"^#{{2,6}} ({NUMBER})\.? ", re.M)


def design_sections() -> list[str]:
    return HEADING.findall(DESIGN.read_text(encoding="utf-8"))


def citations(text: str) -> list[str]:
    """The section numbers one text cites, ranges and lists expanded to their ends."""
    found: list[str] = []
    for m in CITATION.finditer(text):
        found.append(m.group(1))
        found += re.findall(NUMBER, m.group(2))
        found += re.findall(NUMBER, m.group(3))
    return found


def cited_files() -> list[Path]:
    files: list[Path] = []
    for name in SEARCHED:
        path = ROOT / name
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files += [p for p in sorted(path.rglob("*")) if p.is_file() and p.suffix in SUFFIXES]
    return files


def test_citation_pattern_reads_ranges_and_lists() -> None:
    text = "Design §2.3-2.5, and (design §2.10.1\u20132.10.7) and design.md §3 and design §2.5, §2.8 step 2"
    assert citations(text) == ["2.3", "2.5", "2.10.1", "2.10.7", "3", "2.5", "2.8"]


def test_design_sections_are_numbered_once() -> None:
    sections = design_sections()
    assert sections, "docs/design.md has no numbered headings"
    assert len(sections) == len(set(sections)), sorted(s for s in sections if sections.count(s) > 1)


def test_every_design_citation_resolves_to_a_heading() -> None:
    sections = set(design_sections())
    missing = []
    count = 0
    for path in cited_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for number in citations(text):
            count += 1
            if number not in sections:
                missing.append(f"{path.relative_to(ROOT)}: design §{number}")
    assert count > 20, f"only {count} citations found: is the pattern still right?"
    assert not missing, "citations with no heading in docs/design.md:\n" + "\n".join(missing)
