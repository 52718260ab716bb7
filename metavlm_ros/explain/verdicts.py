"""Which failure modes break a failing acceptance criterion: the modes that hold its violations."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from metavlm_ros.assurance.criteria import Criteria
from metavlm_ros.assurance.criterion import Criterion
from metavlm_ros.assurance.envelope_claim import EnvelopeCriterion
from metavlm_ros.assurance.kinds import ExistenceCriterion, RateCriterion
from metavlm_ros.assurance.verdict import FAIL, FailureModes, Verdict
from metavlm_ros.common.document import Paragraph, Section, Table
from metavlm_ros.explain.catalogue import Catalogue, CatalogueSettings
from metavlm_ros.explain.changes import answer_changes
from metavlm_ros.explain.features import FeatureTable
from metavlm_ros.explain.modes import learn, load_all
from metavlm_ros.explain.report import MODES, write_catalogue
from metavlm_ros.method.envelope import violated
from metavlm_ros.method.relations import RELATION_BY_ID

__all__ = ['Broken', 'FailingModes', 'broken_criteria', 'failing_modes', 'in_claim', 'mode_lines']


@dataclass(frozen=True)
class Broken:
    """A failing criterion and the failure modes that hold its violations.

    Attributes:
        criterion: The criterion's id.
        violations: Its violations in the evidence: evaluations inside its claim that violate at the
            criteria's threshold (of its classes, where it names some).
        modes: (rank, how many of those violations the mode holds: inside its rule, with its answer
            change), most first; only modes that hold one.
    """

    criterion: str
    violations: int
    modes: tuple[tuple[int, int], ...]


def mode_lines(catalogue: Catalogue, broken: Broken) -> tuple[str, ...]:
    """A failing criterion's modes in words, one line a mode, most first: rank, rule (with its answer
    change), how many of the criterion's violations it holds, and the mode's violation rate inside and
    outside its rule; one line saying so when no mode holds one.

    The one wording of them: the verdict's files show every line, `metavlm verify`'s console the first.
    """
    if not broken.modes:
        return (f'no mode holds its {broken.violations} violations',)
    lines = []
    for rank, count in broken.modes:
        mode = catalogue.modes[rank - 1]
        lines.append(
            f'{rank}. {mode.rule} ({count} of its {broken.violations} violations; violation rate '
            f'{mode.rate_inside:.1%} inside the rule, {mode.rate_outside:.2%} outside)'
        )
    return tuple(lines)


@dataclass
class FailingModes:
    """`failing_modes`' outcome: the catalogue (None: nothing to learn from), each failing criterion's
    modes, and the files written."""

    catalogue: Catalogue | None
    broken: list[Broken] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)

    def for_verdict(self) -> FailureModes | None:
        """What the verdict's files show: each failing criterion's `mode_lines` and the catalogue's
        modes.md (None when nothing was learnt)."""
        if self.catalogue is None:
            return None
        catalogue = self.catalogue
        markdown = next(f for f in self.files if f.name == f'{MODES}.md')
        return FailureModes({b.criterion: mode_lines(catalogue, b) for b in self.broken}, markdown)


def in_claim(criterion: Criterion, record: dict) -> bool:
    """Whether an evaluation lies where a criterion makes its claim.

    An existence claim: its f_trans bound and region; a rate claim (and a localisation claim): its
    region; an envelope claim: changes by its relation alone within `at_least` of nominal (where its
    boundary should hold); another kind: everywhere.
    """
    if isinstance(criterion, ExistenceCriterion):
        return criterion.holds_record(record)
    parameters = record.get('parameters')
    if parameters is None:
        return False
    if isinstance(criterion, RateCriterion):
        return criterion.within.holds(parameters)
    if isinstance(criterion, EnvelopeCriterion):
        relations = {name for name in parameters if name in RELATION_BY_ID}
        if relations != {criterion.relation}:
            return False
        nominal = RELATION_BY_ID[criterion.relation].nominal
        return abs(parameters[criterion.relation] - nominal) <= criterion.at_least + 1e-12
    return True


def _violates(criterion: Criterion, record: dict, key: str) -> bool:
    classes = getattr(criterion, 'classes', None)
    if classes:
        return any(violated(record, key, cls) for cls in classes)
    return violated(record, key)


def broken_criteria(
    criteria: Criteria, verdicts: Sequence[Verdict], catalogue: Catalogue, table: FeatureTable, key: str
) -> list[Broken]:
    """Each failing criterion's violations in `table`, and the modes of `catalogue` that hold them.

    `key` is the records' violation key the criteria judge by (`Criteria.key`); the catalogue should
    be learnt at the criteria's threshold, so that its answer changes are the violations they count.
    """
    by_id = {c.id: c for c in criteria.criteria}
    threshold = catalogue.settings.threshold or 0.0
    changes = [answer_changes(record, threshold) for _, record in table.records]
    insides = [mode.inside(table) for mode in catalogue.modes]
    broken = []
    for verdict in verdicts:
        criterion = by_id.get(verdict.criterion)
        if verdict.status != FAIL or criterion is None:
            continue
        rows = np.array(
            [
                in_claim(criterion, record) and _violates(criterion, record, key)
                for _, record in table.records
            ],
            dtype=bool,
        )
        classes = getattr(criterion, 'classes', None)
        held = []
        for rank, (mode, inside) in enumerate(zip(catalogue.modes, insides, strict=True), start=1):
            if classes and mode.change.cls not in classes:
                continue
            count = sum(1 for row in np.flatnonzero(rows & inside) if mode.change in changes[row])
            if count:
                held.append((rank, count))
        held.sort(key=lambda h: (-h[1], h[0]))
        broken.append(Broken(criterion.id, int(rows.sum()), tuple(held)))
    return broken


def _section(catalogue: Catalogue, broken: Sequence[Broken]) -> Section:
    rows = [
        [b.criterion, b.violations, rank, catalogue.modes[rank - 1].rule, count]
        for b in broken
        for rank, count in b.modes
    ]
    rows += [
        [b.criterion, b.violations, None, 'no mode holds its violations', None] for b in broken if not b.modes
    ]
    return Section(
        'Failing criteria and the modes that break them',
        [
            Table(
                columns=['criterion', 'its violations', 'mode', 'rule', 'of them inside the mode'],
                rows=rows,
                key='breaks',
            ),
            Paragraph(
                "A criterion's violations: the evaluations inside its claim (an existence claim's f_trans "
                "bound and region, a rate claim's region, an envelope claim's relation alone within its "
                'bound) that violate; a mode holds one that lies inside its rule with its answer change.'
            ),
        ],
        anchor='breaks',
    )


def failing_modes(
    criteria: Criteria, verdicts: Sequence[Verdict], roots: Sequence[Path], out: Path
) -> FailingModes:
    """The failure modes of the evidence a verdict judged, and which of them break each failing criterion,
    written whole to the new directory `out` (modes.json with each mode's `breaks`, modes.md, modes.html).

    The catalogue is learnt at the criteria's threshold. Nothing is written when the evidence holds no
    evaluation to learn from. An `out` that holds an earlier verdict's catalogue (its modes.json) is
    replaced, as the verdict beside it is.

    Raises:
        InputError: `out` exists and is no catalogue, or lies inside the evidence.
        StorageError: `out` could not be written.
    """
    evidence = load_all(roots)
    learnt = learn(evidence, CatalogueSettings(threshold=criteria.threshold))
    if learnt is None:
        return FailingModes(None)
    inside = any(out.resolve().is_relative_to(Path(root).resolve()) for root in roots)
    if (out / f'{MODES}.json').is_file() and not inside:  # inside the evidence: write_catalogue refuses
        shutil.rmtree(out)
    catalogue, table = learnt
    broken = broken_criteria(criteria, verdicts, catalogue, table, criteria.key(evidence[0].kind))
    fields = {
        rank: {'breaks': [b.criterion for b in broken if any(r == rank for r, _ in b.modes)]}
        for rank in range(1, len(catalogue.modes) + 1)
    }
    files = write_catalogue(catalogue, out, roots, sections=[_section(catalogue, broken)], fields=fields)
    return FailingModes(catalogue, broken, files)
