"""Verdicts: what a criterion's judgement says, the figures it rests on, and the overall outcome."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ['EXIT_CODES', 'FAIL', 'INCONCLUSIVE', 'PASS', 'STATUSES', 'FailureModes', 'Verdict', 'overall']

PASS, FAIL, INCONCLUSIVE = 'PASS', 'FAIL', 'INCONCLUSIVE'
STATUSES = (PASS, FAIL, INCONCLUSIVE)
#: `metavlm verify`'s exit status by overall outcome (2 is an error: nothing was judged).
EXIT_CODES = {PASS: 0, FAIL: 1, INCONCLUSIVE: 3}


@dataclass(frozen=True)
class Verdict:
    """One criterion judged.

    Attributes:
        criterion: The criterion's id in the criteria file.
        kind: 'existence', 'rate' or 'envelope'.
        status: PASS, FAIL or INCONCLUSIVE.
        claim: The claim in words, as the criteria file states it.
        reason: Why this status, in one or two sentences with the figures (budget, frames, bounds).
        figures: The numbers behind it, by name (JSON values).
        counterexample: For a FAIL of an existence claim: the evaluation record that breaks it (image,
            index, composition, parameters...), which `metavlm render` makes again.
    """

    criterion: str
    kind: str
    status: str
    claim: str
    reason: str
    figures: dict[str, Any] = field(default_factory=dict)
    counterexample: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f'status {self.status!r}: expected one of {", ".join(STATUSES)}')


@dataclass(frozen=True)
class FailureModes:
    """What breaks each failing criterion, as the verdict's files show it under the criterion.

    explain/ learns the failure modes and words them (explain/verdicts.py `mode_lines`); the verdict's
    writers only place the lines, so the assurance layer needs nothing of explain/.

    Attributes:
        lines: A failing criterion's id -> one line per failure mode that holds its violations, most
            first, or one line saying that none does.
        catalogue: The whole catalogue's Markdown file (OUT/modes/modes.md); verdict.md links it
            relative to itself, the JUnit XML names it as given.
    """

    lines: Mapping[str, tuple[str, ...]]
    catalogue: Path


def overall(verdicts: list[Verdict]) -> str:
    """FAIL if any criterion failed, else INCONCLUSIVE if any is, else PASS (no criterion: INCONCLUSIVE)."""
    statuses = {v.status for v in verdicts}
    if FAIL in statuses:
        return FAIL
    if INCONCLUSIVE in statuses or not verdicts:
        return INCONCLUSIVE
    return PASS
