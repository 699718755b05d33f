"""docs/user-guide/why.md keeps up with the verdict's rules: its table has one row per kind of
orchestrator/diagnosis/rules.py, no more and no fewer, in the rules' order."""

from __future__ import annotations

import re
from pathlib import Path

from orchestrator.diagnosis import rules

WHY = Path(__file__).resolve().parent.parent / "docs" / "user-guide" / "why.md"


def test_the_user_guide_lists_every_verdict_kind_once_in_the_rules_order() -> None:
    rows = re.findall(r"^\| `([a-z0-9_]+)` \|", WHY.read_text(), flags=re.MULTILINE)

    assert rows == list(rules.KINDS)
