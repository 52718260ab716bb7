"""The kinds of acceptance criteria, each declared once: its keys, claim, searches and evidence.

A further kind is one more `Criterion` subclass here (or in a module of its own, as the envelope's in
assurance/envelope_claim.py), with its `ClaimEvidence`, and a row in `KINDS`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from metavlm_ros.assurance.criterion import BASE_KEYS, ClaimEvidence, Criterion, Reader, Region, SearchNeed
from metavlm_ros.assurance.envelope_claim import EnvelopeCriterion
from metavlm_ros.assurance.stats import judge_rate, rate_bounds, samples_to_decide
from metavlm_ros.assurance.verdict import FAIL, INCONCLUSIVE, PASS, Verdict
from metavlm_ros.method.encoding import SearchSpace
from metavlm_ros.method.envelope import violated as violated_by

__all__ = [
    'KINDS',
    'EnvelopeCriterion',
    'ExistenceCriterion',
    'LocalisationCriterion',
    'RateCriterion',
    'render_command',
]


# --- existence: "no violation with f_trans <= x (within a region)" -------------------------------


@dataclass(frozen=True)
class ExistenceCriterion(Criterion):
    """No violation inside a region and / or below an f_trans; searched by NSGA-II, a counterexample FAILs."""

    within: Region | None
    f_trans_max: float | None
    #: Only violations of these classes count (a count or confidence of the class changed, an object
    #: of the class lost, new or displaced); None: any.
    classes: tuple[str, ...] | None = None
    kind: ClassVar[str] = 'existence'
    keys: ClassVar[frozenset[str]] = BASE_KEYS | {'within', 'f_trans_max', 'classes'}

    @classmethod
    def read(cls, reader: Reader, where: str, item: Mapping, cid: str, confidence: float) -> Criterion:
        region = reader.region(f'{where}.within', item['within']) if 'within' in item else None
        f_trans_max = None
        if 'f_trans_max' in item:
            f_trans_max = reader.number(f'{where}.f_trans_max', item['f_trans_max'], 0, 6)
        if region is None and f_trans_max is None:
            raise reader.fail(where, 'an existence claim needs within, f_trans_max or both')
        classes = None
        if 'classes' in item:
            classes = item['classes']
            if (
                not isinstance(classes, list)
                or not classes
                or not all(isinstance(c, str) and c for c in classes)
            ):
                raise reader.fail(
                    f'{where}.classes', f'must be a list of class names, e.g. [trash], got {classes!r}'
                )
            classes = tuple(classes)
        return cls(cid, '', region, f_trans_max, classes)

    def default_claim(self) -> str:
        parts = [f'f_trans <= {self.f_trans_max:g}'] if self.f_trans_max is not None else []
        if self.within is not None:
            parts.append(self.within.describe())
        of = f' of {", ".join(self.classes)}' if self.classes else ''
        return f'no violation{of}' + (' with ' + ' and '.join(parts) if parts else '')

    @classmethod
    def searches(
        cls, criteria: Sequence[Criterion], *, evaluations: int, envelope_rounds: int
    ) -> list[SearchNeed]:
        # The claims on f_trans alone share one search of the whole space; a region gets its own (a
        # search over the whole space rarely lands inside a narrow one).
        plain = [c.id for c in criteria if c.within is None]
        needs = (
            [SearchNeed('search', 'nsga2', SearchSpace.default(), evaluations, ', '.join(plain))]
            if plain
            else []
        )
        for c in criteria:
            if c.within is not None:
                needs.append(SearchNeed(f'existence-{c.id}', 'nsga2', c.within.space(), evaluations, c.id))
        return needs

    def evidence(self) -> ClaimEvidence:
        return _Inside(self)

    def waters(self) -> str | None:
        return None if self.within is None else self.within.waters

    def holds_record(self, record: dict) -> bool:
        """Whether an evaluation record lies inside the claim (f_trans and region)."""
        if self.f_trans_max is not None and record['f_trans'] > self.f_trans_max + 1e-12:
            return False
        if self.within is None:
            return True
        # A record written before records carried `parameters` cannot be placed in a region.
        return record.get('parameters') is not None and self.within.holds(record['parameters'])


def render_command(directory: Path, record: dict) -> str:
    """The `metavlm render` command that makes an evaluation's follow-up again, from its results directory."""
    return (
        f'metavlm render {directory} {record["index"]} --image {record["image"]} '
        f'--algorithm {record["algorithm"]} --seed {record["seed"]}'
    )


def _order(record: dict) -> tuple:
    return (record['f_trans'], record['image'], record['index'])


@dataclass
class _Inside(ClaimEvidence):
    """An existence claim's evidence: the evaluations in its region, and the smallest violation."""

    criterion: ExistenceCriterion
    evaluations: int = 0
    violations: int = 0
    frames: set[str] = field(default_factory=set)
    algorithms: set[str] = field(default_factory=set)
    smallest: tuple[Path, dict] | None = None

    def take(self, directory: Path, settings: dict, record: dict, violated: bool, key: str) -> None:
        if not record.get('order') or not self.criterion.holds_record(record):
            return
        if violated and self.criterion.classes:
            violated = any(violated_by(record, key, c) for c in self.criterion.classes)
        self.evaluations += 1
        self.frames.add(record['image'])
        self.algorithms.add(record['algorithm'])
        if violated:
            self.violations += 1
            if self.smallest is None or _order(record) < _order(self.smallest[1]):
                self.smallest = (directory, record)

    def verdict(self, tally: Any) -> Verdict:
        c, key = self.criterion, tally.key or '?'
        figures = {
            'evaluations_in_region': self.evaluations,
            'frames': len(self.frames),
            'violations': self.violations,
        }
        if self.smallest is not None:
            # The smallest change that breaks the claim: the one an engineer looks at first.
            directory, record = self.smallest
            example = {
                'directory': str(directory),
                **{
                    k: record.get(k)
                    for k in ('image', 'index', 'algorithm', 'seed', 'composition', 'parameters')
                },
                **{k: record.get(k) for k in ('f_trans', 'f_pred', 'source', 'followup', 'frame_sha256')},
                'render': render_command(directory, record),
            }
            reason = (
                f'{self.violations} of {self.evaluations} evaluations in the region violate (threshold '
                f'{key}); the smallest, {record["composition"]} at f_trans {record["f_trans"]:.4g} on '
                f'{record["image"]}, is a counterexample'
            )
            return c.verdict(FAIL, reason, figures, example)
        if not self.evaluations:
            reason = (
                'no evaluation lies in the region: nothing was searched there (metavlm verify searches it)'
            )
            return c.verdict(INCONCLUSIVE, reason, figures)
        reason = (
            f'none found: no violation among {self.evaluations} evaluations in the region on '
            f'{len(self.frames)} frames ({", ".join(sorted(self.algorithms))}); a search finds violations, '
            'it cannot prove there are none'
        )
        return c.verdict(PASS, reason, figures)


# --- rate: "violation rate <= limit within a region" ---------------------------------------------


@dataclass(frozen=True)
class RateCriterion(Criterion):
    """The violation rate of uniform samples of a region is <= limit, bounded exactly (Clopper-Pearson)."""

    within: Region
    limit: float
    samples: int
    confidence: float
    kind: ClassVar[str] = 'rate'
    keys: ClassVar[frozenset[str]] = BASE_KEYS | {'within', 'limit', 'confidence', 'samples'}

    @classmethod
    def read(cls, reader: Reader, where: str, item: Mapping, cid: str, confidence: float) -> Criterion:
        region = reader.region(f'{where}.within', reader.required(where, item, 'within'))
        limit = reader.number(f'{where}.limit', reader.required(where, item, 'limit'), 0, 1)
        samples = item.get('samples', 300)
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise reader.fail(f'{where}.samples', f'must be a whole number of samples >= 1, got {samples!r}')
        return cls(cid, '', region, limit, samples, reader.confidence(where, item, confidence))

    def default_claim(self) -> str:
        return (
            f'violation rate <= {self.limit:.3g} within {self.within.describe()}, '
            f'{self.confidence:.0%} confidence'
        )

    @classmethod
    def searches(
        cls, criteria: Sequence[Criterion], *, evaluations: int, envelope_rounds: int
    ) -> list[SearchNeed]:
        # Named by the kind: rate-<id>, and localisation-<id> for the kind built on this one.
        return [
            SearchNeed(f'{c.kind}-{c.id}', 'uniform', c.within.space(), c.samples, c.id) for c in criteria
        ]

    def evidence(self) -> ClaimEvidence:
        return _Samples(self, self.within.space().as_record())

    def waters(self) -> str | None:
        return self.within.waters


@dataclass
class _Samples(ClaimEvidence):
    """A rate claim's evidence: uniform samples of exactly its region."""

    criterion: RateCriterion
    region: dict
    n: int = 0
    k: int = 0
    frames: set[str] = field(default_factory=set)

    def take(self, directory: Path, settings: dict, record: dict, violated: bool, key: str) -> None:
        # A search's records are not a random sample; another region's samples are not of this one.
        if settings.get('algorithm') == 'uniform' and settings.get('relations') == self.region:
            self.n += 1
            self.k += violated
            self.frames.add(record['image'])

    def verdict(self, tally: Any) -> Verdict:
        c, n, k = self.criterion, self.n, self.k
        figures: dict = {'samples': n, 'violations': k, 'frames': len(self.frames), 'limit': c.limit}
        if not n:
            reason = (
                f"no uniform samples of the region ({c.within.describe()}): a search's records are "
                'not a random sample; metavlm verify draws them'
            )
            return c.verdict(INCONCLUSIVE, reason, figures)
        lower, upper = rate_bounds(k, n, c.confidence)
        status = judge_rate(k, n, c.limit, c.confidence)
        figures.update(rate=k / n, lower=lower, upper=upper, confidence=c.confidence)
        bounds = (
            f'{k}/{n} = {k / n:.2%} on {len(self.frames)} frames, {c.confidence:.0%} bounds '
            f'[{lower:.2%}, {upper:.2%}]'
        )
        if status == PASS:
            reason = f'{bounds}: the upper bound meets the limit {c.limit:.2%}'
        elif status == FAIL:
            reason = f'{bounds}: the lower bound is above the limit {c.limit:.2%}'
        else:
            more = samples_to_decide(k, n, c.limit, c.confidence)
            figures['samples_to_decide'] = more
            if more is None:
                tail = 'the observed rate equals the limit: no number of samples decides'
            else:
                tail = f'about {more} more samples would decide if the observed rate held'
            reason = f'{bounds}: the limit {c.limit:.2%} lies between them; {tail}'
        return c.verdict(status, reason, figures)


# --- localisation: "objects found stay where they are (IoU >= x) in >= 1 - limit of samples" ----


@dataclass(frozen=True)
class LocalisationCriterion(RateCriterion):
    """Detections: the share of uniform samples of a region in which some matched object's box falls
    below IoU `at_least` is <= limit, bounded exactly as a rate (docs/method.md §13: the tolerant IoU
    of the follow-up's box with the source's moved by the warp). A sample with no matched object
    (nothing found, or everything lost) says nothing about where objects are and is not counted."""

    at_least: float = 0.5
    kind: ClassVar[str] = 'localisation'
    keys: ClassVar[frozenset[str]] = RateCriterion.keys | {'at_least'}

    @classmethod
    def read(cls, reader: Reader, where: str, item: Mapping, cid: str, confidence: float) -> Criterion:
        rate = RateCriterion.read(reader, where, item, cid, confidence)
        at_least = reader.number(f'{where}.at_least', reader.required(where, item, 'at_least'), 0, 1)
        return cls(cid, '', rate.within, rate.limit, rate.samples, rate.confidence, at_least)

    def default_claim(self) -> str:
        return (
            f'objects found keep IoU >= {self.at_least:g} in all but {self.limit:.3g} of samples within '
            f'{self.within.describe()}, {self.confidence:.0%} confidence'
        )

    def evidence(self) -> ClaimEvidence:
        return _Placed(self, self.within.space().as_record())


@dataclass
class _Placed(_Samples):
    """A localisation claim's evidence: uniform samples of its region with a matched object, and those
    with a matched object below the claim's IoU."""

    def take(self, directory: Path, settings: dict, record: dict, violated: bool, key: str) -> None:
        matched = (record.get('boxes') or {}).get('matched') or []
        if record.get('kind') != 'detection' or not matched:
            return
        displaced = any(iou < self.criterion.at_least for _, _, iou in matched)
        super().take(directory, settings, record, displaced, key)


KINDS: dict[str, type[Criterion]] = {
    k.kind: k for k in (ExistenceCriterion, RateCriterion, LocalisationCriterion, EnvelopeCriterion)
}
