"""Robustness envelopes: per relation and direction, how far a frame can be changed before the model's
answer does, bracketed by a batched k-section search and read back from any search's records.

A direction is one side of a relation's nominal value inside the search space's range: rotation,
scaling, shear and translation have two (`-`, `+`), CLAHE, downsampling and the underwater relations
one. Its magnitude is |value - nominal| in the relation's unit (degrees, zoom, clip limit, ...).

The boundary search (`EnvelopeSearch`, driven by method/search.py): each round evaluates, for every
direction still open, `points` magnitudes evenly spread over its bracket (round 1: (0, range end], the
end included), judged in generations of the search's population (one model call each). The bracket
then becomes (the largest magnitude found violation-free below the smallest violating one, that
violating one); a
direction with no violation is closed at the range's end ("holds up to the range's end", censored).
So `rounds` rounds cost at most `rounds * points` evaluations a direction and bracket its boundary to
1/(points + 1)**rounds of its range. The violation that refines is that of the search's smallest
threshold (the most demanding); the records keep every threshold's, and `boundaries` reads any.
Answers need not be monotone in the magnitude: the boundary is the smallest violating magnitude
found, and the clean side the largest violation-free magnitude found below it. It draws nothing at
random: the seed changes nothing, the same model and frame give the same records.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from metavlm_ros.method.encoding import Composition, SearchSpace, encode
from metavlm_ros.method.insertion_oracle import class_changes
from metavlm_ros.method.metrics import THRESHOLD_SLACK
from metavlm_ros.method.relations import RELATION_BY_ID, RELATIONS

__all__ = [
    'ENVELOPE_POINTS',
    'ENVELOPE_ROUNDS',
    'Boundary',
    'Bracket',
    'Direction',
    'EnvelopeSearch',
    'boundaries',
    'directions',
    'violated',
]

#: Magnitudes a round evaluates per open direction: with the paper's six relations (10 directions),
#: 80 evaluations the first round, brackets 1/8 of each range wide; each round after that narrows
#: them 9 times for 8 evaluations a direction that broke.
ENVELOPE_POINTS = 8
#: Rounds of the boundary search `metavlm verify` runs by default: brackets 1/(8 * 9 * 9) of each range.
ENVELOPE_ROUNDS = 3


@dataclass(frozen=True)
class Direction:
    """One side of a relation's nominal value: `sign` -1 or +1, magnitudes up to `end`."""

    relation: str
    sign: int
    end: float

    @property
    def name(self) -> str:
        """'rotation-', 'scaling+', ... (the relation id and the side)."""
        return f'{self.relation}{"+" if self.sign > 0 else "-"}'

    def value(self, magnitude: float) -> float:
        return RELATION_BY_ID[self.relation].nominal + self.sign * magnitude


def directions(space: SearchSpace) -> list[Direction]:
    """The directions of the space's enabled relations, in the fixed relation order, `-` before `+`."""
    found = []
    for i in space.indices:
        relation = RELATIONS[int(i)]
        low, high = space.low[int(i)], space.high[int(i)]
        if low < relation.nominal:
            found.append(Direction(relation.id, -1, relation.nominal - low))
        if high > relation.nominal:
            found.append(Direction(relation.id, +1, high - relation.nominal))
    return found


def _genotype(space: SearchSpace, direction: Direction, magnitude: float) -> np.ndarray:
    relation = RELATION_BY_ID[direction.relation]
    i = RELATIONS.index(relation)
    # Clipped: nominal +- (nominal - low) may miss `low` by a bit in binary floating point.
    value = min(max(direction.value(magnitude), space.low[i]), space.high[i])
    active = [r.id == relation.id for r in RELATIONS]
    values = [value if r.id == relation.id else r.nominal for r in RELATIONS]
    return encode(Composition(tuple(active), tuple(values)), space)


@dataclass(frozen=True)
class Bracket:
    """Where a frame's boundary in one direction lies: in (clean, violating].

    `clean` is the largest magnitude known violation-free below `violating` (0: the nominal value);
    `violating` the smallest magnitude known to violate, None when none was found (censored: the model
    held up to `clean`). The one shape of a boundary's evidence, from the boundary search to the
    verdict and the comparison.
    """

    clean: float
    violating: float | None

    @property
    def censored(self) -> bool:
        """Whether no violation was found (the boundary is above `clean`, by how much unknown)."""
        return self.violating is None

    @property
    def point(self) -> float:
        """The boundary as one number: the smallest violating magnitude, or `clean` where censored."""
        return self.clean if self.violating is None else self.violating

    @classmethod
    def of(cls, tried: Mapping[float, bool]) -> Bracket:
        """The bracket magnitudes tried give (magnitude -> violated): the smallest violating one, and
        the largest violation-free one below it (0 when none)."""
        violating = min((m for m, v in tried.items() if v), default=None)
        clean = max(
            (m for m, v in tried.items() if not v and (violating is None or m < violating)), default=0.0
        )
        return cls(clean, violating)

    @classmethod
    def merge(cls, brackets: Iterable[Bracket]) -> Bracket:
        """One boundary's brackets from several batches of evidence, together: the smallest violating
        magnitude any found, and the largest violation-free one below it (0 when none)."""
        brackets = list(brackets)
        violating = min((b.violating for b in brackets if b.violating is not None), default=None)
        clean = max((b.clean for b in brackets if violating is None or b.clean < violating), default=0.0)
        return cls(clean, violating)

    @classmethod
    def smaller(cls, brackets: Iterable[Bracket]) -> Bracket:
        """The bracket of the smaller of several boundaries (a frame's two sides of a relation): it
        holds to m in all only if it does in each."""
        brackets = list(brackets)
        violating = [b.violating for b in brackets if b.violating is not None]
        return cls(min(b.clean for b in brackets), min(violating) if violating else None)


@dataclass
class _Open:
    """A direction of the boundary search: its bracket so far and the magnitudes tried."""

    direction: Direction
    bracket: Bracket
    tried: dict[float, bool]


class EnvelopeSearch:
    """The boundary search of one frame: `ask` a round's genotypes, `tell` their violations.

    Args:
        space: The search space; its enabled relations and ranges give the directions.
        points: Magnitudes per open direction and round.
        resolution: A bracket narrower than this fraction of its range is closed (floats end there).
    """

    def __init__(self, space: SearchSpace, points: int = ENVELOPE_POINTS, resolution: float = 1e-9) -> None:
        self.space = space
        self.resolution = resolution
        self.points = max(1, int(points))
        self._open = [_Open(d, Bracket(0.0, None), {}) for d in directions(space)]
        self._asked: list[tuple[_Open, float]] = []
        #: The directions closed so far, with their brackets.
        self.closed: list[_Open] = []

    @property
    def done(self) -> bool:
        """Whether every direction is closed (censored at its end, or bracketed to `resolution`)."""
        return not self._open

    def ask(self, budget: int) -> np.ndarray:
        """The next round's genotypes (at most `budget`), directions in order, magnitudes ascending."""
        asked = []
        for state in self._open:
            bracket = state.bracket
            if bracket.censored:  # the first round: (0, end], the end included
                magnitudes = [state.direction.end * k / self.points for k in range(1, self.points + 1)]
            else:  # inside the bracket, both ends excluded
                width = (bracket.violating - bracket.clean) / (self.points + 1)
                magnitudes = [bracket.clean + width * k for k in range(1, self.points + 1)]
            for magnitude in magnitudes:
                if magnitude not in state.tried and (bracket.censored or magnitude < bracket.violating):
                    asked.append((state, magnitude))
        self._asked = asked[:budget]
        return np.array([_genotype(self.space, s.direction, m) for s, m in self._asked]).reshape(
            len(self._asked), self.space.n_var
        )

    def tell(self, violations: Iterable[bool | None]) -> None:
        """Each asked genotype's violation at the refining threshold (None: the evaluation failed, and
        its magnitude is asked again); narrows or closes directions."""
        for (state, magnitude), violated in zip(self._asked, violations, strict=True):
            if violated is not None:
                state.tried[magnitude] = bool(violated)
        still = []
        for state in self._open:
            state.bracket = Bracket.of(state.tried)
            if state.bracket.censored:
                if state.direction.end in state.tried:
                    self.closed.append(state)  # holds up to the range's end: closed, censored
                else:
                    still.append(state)
            elif state.bracket.violating - state.bracket.clean > self.resolution * state.direction.end:
                still.append(state)
            else:
                self.closed.append(state)
        self._open = still
        self._asked = []


@dataclass(frozen=True)
class Boundary(Bracket):
    """One frame's bracket in one direction at one violation criterion, read from the records.

    `reached_end`: censored at the range's end (the model held up to it); `evaluations`: the
    magnitudes the records tried in that direction.
    """

    image: str
    direction: str
    reached_end: bool
    evaluations: int


def violated(record: dict, key: str, cls: str | None = None) -> bool:
    """Whether an evaluation record violates at criterion `key` ('0.05', 'count', 'iou0.5'): any class
    (the record's own flag), or only class `cls` (its change alone: a count that changed, a confidence
    that moved by the threshold or more, Eqs. 4, 5; an object of that class lost, new or displaced,
    docs/method.md §13)."""
    if cls is None:
        return bool((record.get('violation') or {}).get(key))
    if record.get('kind') == 'detection':
        boxes, found = record.get('boxes') or {}, record.get('followup_detections') or []
        expected = boxes.get('expected') or []
        classes = [expected[i]['class'] for i in boxes.get('lost', [])]
        classes += [found[j]['class'] for j in boxes.get('new', [])]
        classes += [expected[i]['class'] for i, _, _ in boxes.get('displaced', [])]
        return cls in classes
    source, followup = record.get('source') or {}, record.get('followup') or {}
    if cls not in source or cls not in followup:
        return False
    change = abs(followup[cls] - source[cls])
    inserted = record.get('inserted')
    if inserted is not None:
        # One more of the pasted class is expected; a confidence is judged on that class alone (§13).
        kind = 'count' if key == 'count' else 'confidence'
        changes = class_changes(kind, source, followup, inserted['class'], bool(inserted.get('expected')))
        change = changes.get(cls, 0.0)
    return change >= 1 if key == 'count' else change >= float(key) - THRESHOLD_SLACK


def boundaries(
    records: Iterable[dict], key: str, space: SearchSpace | None = None, cls: str | None = None
) -> list[Boundary]:
    """Every (frame, direction) boundary at violation criterion `key` ('0.05', 'count') that the
    evaluation records show: from their single-relation evaluations (an envelope search's, and those
    any other search judged), failed ones left out. `space` gives the ranges' ends (the paper's by
    default); with `cls`, the boundary of that class's answer alone (`violated`)."""
    space = space or SearchSpace.default()
    ends = {d.name: d.end for d in directions(space)}
    tried: dict[tuple[str, str], dict[float, bool]] = {}
    for record in records:
        # Records written before they carried `parameters` cannot say which relation they changed.
        if record.get('order') != 1 or record.get('failed') or not record.get('parameters'):
            continue
        ((relation, value), *_) = record['parameters'].items()
        nominal = RELATION_BY_ID[relation].nominal
        if value == nominal:
            continue  # magnitude 0 carries no side (CLAHE at nominal): not an envelope point
        direction = f'{relation}{"+" if value > nominal else "-"}'
        broken = violated(record, key, cls)
        magnitude = round(abs(value - nominal), 12)
        seen = tried.setdefault((record['image'], direction), {})
        seen[magnitude] = seen.get(magnitude, False) or broken
    found = []
    for (image, direction), seen in sorted(tried.items()):
        bracket = Bracket.of(seen)
        end = ends.get(direction)
        reached = bracket.censored and end is not None and bracket.clean >= round(end, 12)
        found.append(Boundary(bracket.clean, bracket.violating, image, direction, reached, len(seen)))
    return found
