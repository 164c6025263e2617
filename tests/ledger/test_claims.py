"""helpers.ledger.claims (lesson 08): every claim is distinct and cites a lesson section that exists."""

from __future__ import annotations

from pathlib import Path

from helpers.ledger import claims

ROOT = Path(__file__).resolve().parents[2]


def test_claims_are_distinct_and_cite_a_lesson_that_exists() -> None:
    ids = [c.id for c in claims.CLAIMS]
    assert len(ids) >= 20 and len(set(ids)) == len(ids)
    assert len({c.text for c in claims.CLAIMS}) == len(ids)
    notebooks = {p.name[:2] for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    for c in claims.CLAIMS:
        assert c.lesson[:2] in notebooks, (c.id, c.lesson)
        assert "§" in c.lesson, (c.id, c.lesson)


def _headings(notebook: Path) -> list[str]:
    import json

    cells = json.loads(notebook.read_text())["cells"]
    return [line for c in cells if c["cell_type"] == "markdown"
            for line in "".join(c["source"]).splitlines() if line.startswith(("## ", "### "))]


def test_each_claim_cites_a_section_that_exists() -> None:
    import re

    for c in claims.CLAIMS:
        number, section = c.lesson.split(" §")
        (notebook,) = (ROOT / "notebooks").glob(f"{number}_*.ipynb")
        pattern = re.compile(rf"^###? {section}\s*[.·]")  # a folded section is a ### under Going deeper
        assert any(pattern.match(h) for h in _headings(notebook)), (c.id, c.lesson, notebook.name)
