"""The envelope kind of criterion: "rotation holds to +-1 deg on >= 80 % of frames", at stated conditions.

A relation whose extras change its effect (MR12's water type and depth) is measured at conditions: each
point of its `within` (every Jerlov type from II to 5C, both ends of a depth interval), the nominal
value of every extra it does not name; a frame's boundary is the smallest over them.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from metavlm_ros.assurance.criterion import BASE_KEYS, ClaimEvidence, Criterion, Reader, SearchNeed
from metavlm_ros.assurance.stats import judge_envelope
from metavlm_ros.assurance.verdict import FAIL, INCONCLUSIVE, PASS, Verdict
from metavlm_ros.method.algorithms import ENVELOPE
from metavlm_ros.method.encoding import SearchSpace
from metavlm_ros.method.envelope import ENVELOPE_POINTS, Bracket, boundaries, directions
from metavlm_ros.method.relations import DEFAULT_RELATIONS, RELATION_BY_ID, RELATION_GROUPS

__all__ = [
    'CONDITIONED',
    'MAX_CONDITIONS',
    'EnvelopeCriterion',
    'describe_condition',
    'point_ranges',
    'record_condition',
]

_DIRECTIONS = ('-', '+', 'both')
#: Relations measured at conditions even when a claim names none: MR12, whose boundary moves by orders
#: of magnitude between Jerlov I and 9C; unnamed, its conditions are nominal (Jerlov I at the surface).
CONDITIONED = frozenset(RELATION_GROUPS['optics'])
#: The most conditions one claim may be measured at: each is a boundary search of every frame.
MAX_CONDITIONS = 24
# Records carry float noise: an extra this close to a condition's value was measured there.
_TOLERANCE = 1e-9


@dataclass(frozen=True)
class EnvelopeCriterion(Criterion):
    """A relation's boundary is >= at_least on >= `frames` of frames (order statistics of brackets);
    `within` names conditions (the relation's extras, e.g. {water_type: [II, 5C]}) it is measured at."""

    relation: str
    direction: str
    at_least: float
    frames: float
    confidence: float
    within: tuple[tuple[str, float, float], ...] = ()
    kind: ClassVar[str] = 'envelope'
    keys: ClassVar[frozenset[str]] = BASE_KEYS | {
        'relation',
        'direction',
        'at_least',
        'frames',
        'confidence',
        'within',
    }

    @classmethod
    def read(cls, reader: Reader, where: str, item: Mapping, cid: str, confidence: float) -> Criterion:
        relation = reader.required(where, item, 'relation')
        if relation not in RELATION_BY_ID:
            raise reader.fail(f'{where}.relation', f'unknown relation (known: {", ".join(RELATION_BY_ID)})')
        direction = str(item.get('direction', 'both'))
        sides = {d.name[-1]: d.end for d in directions(SearchSpace.from_options([relation]))}
        if direction not in _DIRECTIONS or (direction != 'both' and direction not in sides):
            raise reader.fail(
                f'{where}.direction', f'{relation} has the directions {", ".join(sides)}; got {direction!r}'
            )
        ends = [end for side, end in sides.items() if direction in ('both', side)]
        at_least = reader.number(f'{where}.at_least', reader.required(where, item, 'at_least'), 0, min(ends))
        frames = reader.number(f'{where}.frames', reader.required(where, item, 'frames'), 0, 1)
        within = reader.conditions(f'{where}.within', item['within'], relation) if 'within' in item else ()
        criterion = cls(
            cid, '', relation, direction, at_least, frames, reader.confidence(where, item, confidence), within
        )
        if len(criterion.points) > MAX_CONDITIONS:
            raise reader.fail(
                f'{where}.within',
                f'{len(criterion.points)} conditions to measure, each a boundary search of every frame: at '
                f'most {MAX_CONDITIONS}; narrow the ranges',
            )
        return criterion

    @property
    def conditioned(self) -> bool:
        """Whether the claim is measured at conditions (it names some, or its relation is MR12)."""
        return bool(self.within) or self.relation in CONDITIONED

    @property
    def points(self) -> list[tuple[float, ...]]:
        """The conditions, each a value per extra of the relation: the points of each named interval
        (`Extra.points`: its ends and the named values between), the nominal value of the others."""
        relation = RELATION_BY_ID[self.relation]
        named = {name: (lo, hi) for name, lo, hi in self.within}
        axes = [
            extra.points(*named[extra_id]) if extra_id in named else (extra.nominal,)
            for extra, extra_id in zip(relation.extras, relation.extra_ids, strict=True)
        ]
        return list(itertools.product(*axes))

    def ranges(self) -> dict[str, tuple[float, float]]:
        """Each extra of the relation over the claim: its named interval, or its nominal value."""
        relation = RELATION_BY_ID[self.relation]
        named = {name: (lo, hi) for name, lo, hi in self.within}
        return {
            extra_id: named.get(extra_id, (extra.nominal, extra.nominal))
            for extra, extra_id in zip(relation.extras, relation.extra_ids, strict=True)
        }

    def condition_text(self, ranges: Mapping[str, tuple[float, float]] | None = None) -> str:
        """Conditions in words: the relation's own phrase (MR12: 'Jerlov II to 5C, at the surface'), or
        each named extra's interval."""
        ranges = self.ranges() if ranges is None else ranges
        return describe_condition(self.relation, ranges, {name for name, _, _ in self.within})

    def point_ranges(self, point: tuple[float, ...]) -> dict[str, tuple[float, float]]:
        """One condition as ranges of zero width, by extra id."""
        return point_ranges(self.relation, point)

    def waters(self) -> str | None:
        relation = RELATION_BY_ID[self.relation]
        return self.condition_text() if self.conditioned and relation.phrase is not None else None

    def default_claim(self) -> str:
        sides = [name[-1] for name in self.direction_names]
        side = '+-' if len(sides) == 2 else sides[0]
        claim = (
            f'{self.relation} holds to {side}{self.at_least:g} on >= {self.frames:.0%} of frames, '
            f'{self.confidence:.0%} confidence'
        )
        return f'{claim} ({self.condition_text()})' if self.conditioned else claim

    @property
    def direction_names(self) -> list[str]:
        """The directions the claim is about: 'rotation-', 'rotation+', ...; `both` of a relation with
        one side (downsampling, MR12) is that side."""
        has = [d.name for d in directions(SearchSpace.from_options([self.relation]))]
        sides = ('-', '+') if self.direction == 'both' else (self.direction,)
        return [name for name in (f'{self.relation}{side}' for side in sides) if name in has]

    @property
    def own_searches(self) -> bool:
        """Whether the claim needs boundary searches of its own: it names conditions other than the
        nominal ones, which the shared boundary search measures."""
        nominal = tuple(extra.nominal for extra in RELATION_BY_ID[self.relation].extras)
        return self.conditioned and self.points != [nominal]

    @classmethod
    def searches(
        cls, criteria: Sequence[Criterion], *, evaluations: int, envelope_rounds: int
    ) -> list[SearchNeed]:
        # One boundary search over every relation the claims name at its nominal conditions, and one
        # per condition a claim names (`envelope-<id>-<condition>`).
        shared = [c for c in criteria if not c.own_searches]
        needs = []
        if shared:
            order = list(DEFAULT_RELATIONS) + [c.relation for c in shared]
            relations = sorted({c.relation for c in shared}, key=order.index)
            space = SearchSpace.from_options(relations)
            budget = ENVELOPE_POINTS * len(directions(space)) * envelope_rounds
            needs.append(SearchNeed('envelope', ENVELOPE, space, budget, ', '.join(c.id for c in shared)))
        for c in criteria:
            if c.own_searches:
                for point in c.points:
                    space = SearchSpace.from_options([c.relation], c.point_ranges(point))
                    budget = ENVELOPE_POINTS * len(directions(space)) * envelope_rounds
                    why = f'{c.id}: {c.condition_text(c.point_ranges(point))}'
                    needs.append(SearchNeed(f'envelope-{c.id}-{c.slug(point)}', ENVELOPE, space, budget, why))
        return needs

    def slug(self, point: tuple[float, ...]) -> str:
        """A condition as a directory name: each named extra and its value ('typeII-depth0')."""
        relation = RELATION_BY_ID[self.relation]
        named = {name for name, _, _ in self.within}
        parts = [
            f'{extra.name}{extra.text(v)}'
            for extra, extra_id, v in zip(relation.extras, relation.extra_ids, point, strict=True)
            if extra_id in named
        ]
        return re.sub(r'[^A-Za-z0-9_.-]+', '_', '-'.join(parts) or 'nominal')

    def evidence(self) -> ClaimEvidence:
        return _AtConditions(self) if self.conditioned else _Boundaries(self)


def record_condition(record: Mapping, relation: str) -> tuple[float, ...] | None:
    """The condition an evaluation of `relation` alone was made at: each extra's value, in the relation's
    order (a record without an extra had it nominal); None for any other record (another relation or
    several, a failed evaluation, a record without parameters)."""
    parameters = record.get('parameters')
    if record.get('order') != 1 or record.get('failed') or not parameters:
        return None
    if next(iter(parameters)) != relation:
        return None
    found = RELATION_BY_ID[relation]
    return tuple(
        float(parameters.get(i, e.nominal)) for i, e in zip(found.extra_ids, found.extras, strict=True)
    )


def point_ranges(relation: str, point: Sequence[float]) -> dict[str, tuple[float, float]]:
    """One condition of `relation` as ranges of zero width, by extra id."""
    return {name: (v, v) for name, v in zip(RELATION_BY_ID[relation].extra_ids, point, strict=True)}


def describe_condition(
    relation: str, ranges: Mapping[str, tuple[float, float]], named: Collection[str] | None = None
) -> str:
    """A condition, or a region of them, in words: the relation's own phrase (MR12: 'Jerlov II to 5C, at
    the surface'), else each extra in `named` (default: every extra in `ranges`) with its interval."""
    found = RELATION_BY_ID[relation]
    if found.phrase is not None:
        return found.phrase(ranges)
    named = set(ranges) if named is None else set(named)
    extras = dict(zip(found.extra_ids, found.extras, strict=True))
    return ', '.join(
        f'{name} {extras[name].text(lo)}' + ('' if lo == hi else f' to {extras[name].text(hi)}')
        for name, (lo, hi) in ranges.items()
        if name in named
    )


def _frames_for_a_bound(q: float, confidence: float) -> int:
    """The fewest frames whose smallest value bounds the q-quantile from below at `confidence`."""
    return math.ceil(math.log(1 - confidence) / math.log(1 - q))


@dataclass
class _Boundaries(ClaimEvidence):
    """An envelope claim's evidence: each frame's bracket in its direction(s), from the tally."""

    criterion: EnvelopeCriterion

    def frame_brackets(self, tally: Any) -> tuple[list[Bracket], int]:
        """One bracket per frame the tally saw (the smaller of the claim's directions), and how many
        frames have evidence; a frame without any counts as holding to 0 with no upper end."""
        return _smallest(sorted(tally.frames), [tally.brackets.merged()], self.criterion.direction_names)

    def more_figures(self, tally: Any) -> dict:
        """Figures beyond the bounds' (none here)."""
        return {}

    def verdict(self, tally: Any) -> Verdict:
        c = self.criterion
        brackets, with_evidence = self.frame_brackets(tally)
        censored = sum(b.censored for b in brackets)
        figures: dict = {
            'frames': len(brackets),
            'frames_with_evidence': with_evidence,
            'censored': censored,
            'at_least': c.at_least,
            'share': c.frames,
            **self.more_figures(tally),
        }
        if not with_evidence:
            reason = f'no evaluation of {c.relation} alone on any frame (metavlm verify searches them)'
            return c.verdict(INCONCLUSIVE, reason, figures)
        # "On every frame" (frames 1.0, q 0) is about these frames only, no population to bound.
        judged = judge_envelope(brackets, 1 - c.frames, c.at_least, c.confidence)
        lower, upper = judged.bounds.lower, judged.bounds.upper
        figures.update(lower=lower, upper=upper, confidence=c.confidence)
        share = f'{c.frames:.0%}'
        if judged.status == PASS:
            reason = f'on {share} of frames it holds to at least {lower:.4g} ({c.confidence:.0%} lower bound)'
        elif judged.status == FAIL:
            reason = f'on more than {1 - c.frames:.0%} of frames it breaks by {upper:.4g} (upper bound)'
        else:
            shown = lambda v: 'none' if v is None else f'{v:.4g}'  # noqa: E731
            reason = (
                f'bounds [{shown(lower)}, {shown(upper)}] on the boundary {share} of frames clear, from '
                f'{with_evidence} of {len(brackets)} frames ({censored} hold to the searched end)'
            )
            if lower is None and c.frames < 1:
                needed = _frames_for_a_bound(1 - c.frames, c.confidence)
                reason += f'; a lower bound needs at least {needed} frames'
                figures['frames_for_a_lower_bound'] = needed
        return c.verdict(judged.status, reason, figures)


def _smallest(
    frames: Sequence[str], found: Sequence[Mapping[tuple[str, str], Bracket]], names: Sequence[str]
) -> tuple[list[Bracket], int]:
    """Per frame, the bracket of the smallest boundary over every (condition, direction), and how many
    frames have all of them; a frame that lacks one holds to 0 with no upper end."""
    brackets, with_evidence = [], 0
    for image in frames:
        per = [where[(image, name)] for where in found for name in names if (image, name) in where]
        if len(per) != len(found) * len(names):
            brackets.append(Bracket(0.0, None))
            continue
        brackets.append(Bracket.smaller(per))
        with_evidence += 1
    return brackets, with_evidence


@dataclass
class _AtConditions(_Boundaries):
    """An envelope claim's evidence at conditions: the claim's relation alone, at each condition's exact
    extras (a record without an extra had it nominal), bracketed condition by condition."""

    taken: dict[int, list[dict]] = field(default_factory=dict)

    def take(self, directory: Any, settings: dict, record: dict, violated: bool, key: str) -> None:
        extras = record_condition(record, self.criterion.relation)
        if extras is None:
            return
        for n, point in enumerate(self.criterion.points):
            if all(abs(a - b) <= _TOLERANCE for a, b in zip(extras, point, strict=True)):
                self.taken.setdefault(n, []).append(record)
                return

    def _found(self, tally: Any) -> list[dict[tuple[str, str], Bracket]]:
        space = SearchSpace.from_options([self.criterion.relation])
        return [
            {(b.image, b.direction): b for b in boundaries(self.taken.get(n, []), tally.key, space)}
            if tally.key is not None
            else {}
            for n in range(len(self.criterion.points))
        ]

    def frame_brackets(self, tally: Any) -> tuple[list[Bracket], int]:
        return _smallest(sorted(tally.frames), self._found(tally), self.criterion.direction_names)

    def more_figures(self, tally: Any) -> dict:
        """How many conditions; per condition every frame has evidence at, the median frame's boundary
        (its smallest violating magnitude, or where it held); the condition where that is smallest."""
        c, frames = self.criterion, sorted(tally.frames)
        medians = {}
        for point, found in zip(c.points, self._found(tally), strict=True):
            brackets, with_evidence = _smallest(frames, [found], c.direction_names)
            if frames and with_evidence == len(frames):
                points = sorted(b.point for b in brackets)
                medians[c.condition_text(c.point_ranges(point))] = points[(len(points) - 1) // 2]
        figures: dict = {'conditions': len(c.points)}
        if medians:
            figures['median_boundary_by_condition'] = medians
            figures['weakest_condition'] = min(medians, key=medians.get)
        return figures
