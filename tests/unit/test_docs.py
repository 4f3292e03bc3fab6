"""The user's documentation: a README that fits a reading, no history in it, links that lead somewhere."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", ROOT / "BENCHMARKS.md",
        *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_readme_is_at_most_15_kb():
    assert (ROOT / "README.md").stat().st_size <= 15_000


def test_the_documentation_tells_no_history_of_its_own_rounds():
    found = subprocess.run(["git", "grep", "-n", "-i", r"this round\|before this round\|the issue", "--",
                            "*.md", ":!CHANGELOG.md"], cwd=ROOT, capture_output=True, text=True)
    assert found.stdout == ""


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_relative_link_leads_to_a_file(doc):
    broken = [target for target in LINK.findall(doc.read_text())
              if "://" not in target and not target.startswith("mailto:")
              and not (doc.parent / target).exists()]
    assert broken == []
