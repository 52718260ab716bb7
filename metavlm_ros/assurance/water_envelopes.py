"""Models' envelopes of MR12 `water` per Jerlov water type: each model verified on the same frames against a
criteria file of one envelope claim per type, each type's median boundary read from the model's verdict.

The figures are the envelope claims' own (`median_boundary_by_condition`, assurance/envelope_claim.py):
per type, the median frame's smallest violating range added, from the boundary search `metavlm verify`
runs. A median frame that held up to the relation's maximum is beyond the range ('> 10 m').
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metavlm_ros.assurance.criteria import Criteria
from metavlm_ros.assurance.envelope_claim import EnvelopeCriterion
from metavlm_ros.assurance.verdict import Verdict
from metavlm_ros.assurance.workflow import verify_frames
from metavlm_ros.common.document import Block, Code, Link, Paragraph, Section, Table
from metavlm_ros.common.errors import ParameterError
from metavlm_ros.common.images import Frame
from metavlm_ros.method.envelope import ENVELOPE_POINTS
from metavlm_ros.method.relations import RELATION_BY_ID
from metavlm_ros.method.water import WATER_TYPES, water_type_name

__all__ = ['Boundary', 'Subject', 'WaterEnvelopes', 'measure_waters', 'water_conditions']

WATER = 'water'
# Oceanic types come first in Jerlov's series (WATER_TYPES): I, IA, IB, II, III; then coastal 1C-9C.
_OCEANIC = frozenset(WATER_TYPES[:5])


@dataclass(frozen=True)
class Subject:
    """A model whose envelope is measured: `name` its directory (verify-<name>), `title` its column."""

    name: str
    title: str
    backend: str
    model: str


@dataclass(frozen=True)
class Boundary:
    """One type's figure for one model: the median frame's boundary in metres (None: some frame has no
    evidence), over `frames` frames of which `censored` held up to the range's maximum."""

    median: float | None
    frames: int
    censored: int

    @property
    def beyond_range(self) -> bool:
        """Whether the median frame held up to the maximum (the lower median, as the figure takes it:
        at least that many frames of the upper half held)."""
        return self.median is not None and self.censored >= self.frames - (self.frames - 1) // 2

    def text(self, maximum: float) -> str:
        """The table's cell: '0.56 m', '> 10 m' or 'no evidence'."""
        if self.median is None:
            return 'no evidence'
        return f'> {maximum:g} m' if self.beyond_range else f'{self.median:.2f} m'

    def reads(self, maximum: float) -> str:
        """The cell in a sentence: 'to 0.56 m', 'beyond 10 m'."""
        if self.median is None:
            return 'to a range not measured'
        return f'beyond {maximum:g} m' if self.beyond_range else f'to {self.median:.2f} m'


def water_conditions(criteria: Criteria) -> list[tuple[str, str]]:
    """Each claim's Jerlov type and its condition in words ('II', 'Jerlov II, at the surface').

    Raises:
        ParameterError: A claim is not an envelope of `water` at one water type and nothing else.
    """
    found = []
    for c in criteria.criteria:
        # Only the type named: the other extras nominal (at the surface, no lamps), as the table says.
        if (
            not isinstance(c, EnvelopeCriterion)
            or c.relation != WATER
            or [name for name, _, _ in c.within] != ['water_type']
            or len(c.points) != 1
        ):
            raise ParameterError(
                f'{criteria.path}: {c.id}: must be an envelope claim on {WATER} at one Jerlov water type '
                'and no other condition (within: {water_type: [5C, 5C]})'
            )
        (point,) = c.points
        found.append((water_type_name(point[0]), c.condition_text(c.point_ranges(point))))
    return found


def _boundary(verdict: Verdict, condition: str) -> Boundary:
    figures = verdict.figures
    median = (figures.get('median_boundary_by_condition') or {}).get(condition)
    return Boundary(median, int(figures.get('frames', 0)), int(figures.get('censored', 0)))


@dataclass
class WaterEnvelopes:
    """What `measure_waters` found: per model (its title), per water type, the boundary."""

    criteria: Criteria
    frames: list[str]
    envelope_rounds: int
    types: list[tuple[str, str]]
    subjects: list[Subject]
    keys: dict[str, str]
    boundaries: dict[str, dict[str, Boundary]]
    out: Path

    @property
    def maximum(self) -> float:
        return float(RELATION_BY_ID[WATER].high)

    @property
    def resolution(self) -> float:
        """How wide the last round leaves a bracket, in metres."""
        return self.maximum / ENVELOPE_POINTS / (ENVELOPE_POINTS + 1) ** (self.envelope_rounds - 1)

    def as_json(self) -> dict[str, Any]:
        """The figures with what they were measured on (report.json's `water`)."""
        return {
            'criteria': str(self.criteria.path),
            'criteria_sha256': self.criteria.sha256,
            'relation': WATER,
            'range_max': self.maximum,
            'frames': self.frames,
            'envelope_rounds': self.envelope_rounds,
            'resolution_m': self.resolution,
            'types': [name for name, _ in self.types],
            'conditions': [condition for _, condition in self.types],
            'models': {
                s.title: {
                    'results_dir': str(self.out / f'verify-{s.name}'),
                    'key': self.keys[s.title],
                    'boundaries': {
                        name: {**vars(b), 'beyond_range': b.beyond_range}
                        for name, b in self.boundaries[s.title].items()
                    },
                }
                for s in self.subjects
            },
        }

    def section(self, heading: str, link: str) -> Section:
        """The table (rows: water types, columns: models), what it means, and where its evidence is;
        `link` is `out` relative to the report."""
        titles = [s.title for s in self.subjects]
        rows = [
            [f'{name} ({"oceanic" if name in _OCEANIC else "coastal"})']
            + [self.boundaries[t][name].text(self.maximum) for t in titles]
            for name, _ in self.types
        ]
        (first, _), (last, _) = self.types[0], self.types[-1]
        reads = '; '.join(
            f'the {t} holds {self.boundaries[t][first].reads(self.maximum)} of added water in Jerlov '
            f'{first} and {self.boundaries[t][last].reads(self.maximum)} in {last}'
            for t in titles
        )
        keys = ', '.join(f'{t} {self.keys[t]}' for t in titles)
        # Where the scene's ranges came from: the footage's range maps (water_ranges: truth) or the prior.
        if self.criteria.water_ranges == 'truth':
            where = ' on the optical axis', "each pixel's path gaining what its range gains (its range map)"
        else:
            where = '', 'the same range over the frame'
        blocks: list[Block] = [
            Paragraph(
                'How much water each model takes: per Jerlov water type, the median over '
                f'{len(self.frames)} frame(s) of the smallest range added{where[0]} (metres of water '
                'between camera and scene, MR12 ',
                Code(WATER),
                f' alone, at the surface, no lamps, {where[1]}) at which the answer '
                f'violates; "> {self.maximum:g} m" where the median frame held up to the relation\'s '
                'maximum.',
            ),
            Table(columns=['water type', *titles], rows=rows),
            Paragraph(
                f'Read: on the median frame, {reads}. A boundary beyond the range says the answer did not '
                'change, not that it stayed right: a frame lost in the veil can get the answer the source '
                'got (docs/demo.md).'
            ),
            Paragraph(
                'Measured by this run, from model calls: the boundary search of ',
                Code('metavlm verify'),
                f' ({self.envelope_rounds} rounds of {ENVELOPE_POINTS} ranges a frame and type, brackets '
                f'{self.resolution:.2f} m wide; a cell of {self.resolution:.2f} m: the answer broke at the '
                'smallest range tried) with ',
                Code(self.criteria.path.name),
                f' on the frames {", ".join(self.frames)}; violations as above, at the criteria threshold '
                f'{self.criteria.threshold:g} (violation keys: {keys}). '
                'Verdicts and evidence: ',
                *_links(self.subjects, link),
                '.',
            ),
        ]
        return Section(heading, blocks)


def _links(subjects: Sequence[Subject], link: str) -> list[Any]:
    parts: list[Any] = []
    for n, s in enumerate(subjects):
        parts += [', ' if n else '', Link(s.title, f'{link}/verify-{s.name}/verdict.md')]
    return parts


def measure_waters(
    criteria: Criteria,
    frames: Sequence[Frame],
    subjects: Sequence[Subject],
    out: Path,
    *,
    population: int,
    evaluations: int,
    seed: int,
    envelope_rounds: int,
    log: Callable[[str], None] = print,
) -> WaterEnvelopes:
    """Verify each subject on `frames` against `criteria` (one envelope claim on `water` per type) into
    out/verify-<name>, each with its evidence, verdict and SHA256SUMS; read each type's boundary.

    Raises:
        ParameterError: A claim is not an envelope of `water` at one water type.
    """
    from metavlm_ros.models.registry import backend_class
    from metavlm_ros.models.vlm import create_backend, model_identity

    types = water_conditions(criteria)
    keys, found = {}, {}
    for s in subjects:
        options = {'device': 'cpu'}
        log(f'  water {s.name}: {len(types)} Jerlov type(s) on {len(frames)} frame(s)')
        verified = verify_frames(
            criteria, frames, create_backend(s.backend, s.model, **options),
            model_identity(s.backend, s.model, options), out / f'verify-{s.name}', population=population,
            evaluations=evaluations, seed=seed, working_size='auto', envelope_rounds=envelope_rounds,
            log=lambda line: None,  # its searches are the criteria file's, one per type: not listed
        )  # fmt: skip
        keys[s.title] = criteria.key(backend_class(s.backend).kinds[0])
        verdicts = zip(types, verified.verdicts, strict=True)
        found[s.title] = {name: _boundary(v, condition) for (name, condition), v in verdicts}
    ids = [f.id for f in frames]
    return WaterEnvelopes(criteria, ids, envelope_rounds, types, list(subjects), keys, found, out)
