"""Judging acceptance criteria on evidence: the results directories under one root, read as they are."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from metavlm_ros.assurance.criteria import Criteria, Criterion
from metavlm_ros.assurance.stats import judge_rate, quantile_bounds, rate_bounds, samples_to_decide
from metavlm_ros.assurance.verdict import FAIL, INCONCLUSIVE, PASS, Verdict
from metavlm_ros.common.errors import InputError
from metavlm_ros.common.record_format import iter_jsonl
from metavlm_ros.common.results import EVALUATIONS, SUMMARY, read_identity, records_file
from metavlm_ros.method.algorithms import ENVELOPE
from metavlm_ros.method.encoding import SearchSpace
from metavlm_ros.method.envelope import boundaries
from metavlm_ros.method.relations import RELATION_BY_ID

__all__ = [
    'Brackets',
    'Evidence',
    'Run',
    'Tally',
    'envelope_table',
    'judge',
    'load_evidence',
    'merged_boundaries',
]


@dataclass
class Run:
    """One results directory: its identity (None for a directory without search.json) and records."""

    directory: Path
    identity: dict | None
    records: list[dict]
    summaries: list[dict] = field(default_factory=list)

    @property
    def settings(self) -> dict:
        return (self.identity or {}).get('settings') or {}

    @property
    def space(self) -> SearchSpace:
        stored = self.settings.get('relations')
        return SearchSpace.from_record(stored) if stored else SearchSpace.default()

    def label(self, root: Path) -> str:
        return str(self.directory.relative_to(root)) if self.directory != root else '.'


@dataclass
class Evidence:
    """Every results directory under a root, with what they were judged by."""

    root: Path
    runs: list[Run] = field(default_factory=list)

    @property
    def kind(self) -> str:
        kinds = {r['kind'] for run in self.runs for r in run.records if r.get('kind')}
        if len(kinds) > 1:
            raise InputError(f'{self.root}: records of count and confidence models together; judge one model')
        return kinds.pop() if kinds else 'confidence'

    @property
    def models(self) -> list[str]:
        return sorted({str(r.get('model')) for run in self.runs for r in run.records if r.get('model')})

    @property
    def classes(self) -> list[str]:
        """The classes the records answer about, in the order the model gives them."""
        found: dict[str, None] = {}
        for run in self.runs:
            for record in run.records[:1]:
                found.update(dict.fromkeys(record.get('source') or {}))
        return list(found)

    @property
    def keys(self) -> list[str]:
        """The violation criteria the records hold ('0.01', ..., or 'count')."""
        return sorted({k for run in self.runs for r in run.records[:1] for k in (r.get('violation') or {})})

    @property
    def frames(self) -> list[str]:
        return sorted({r['image'] for run in self.runs for r in run.records})

    def evaluations(self) -> Iterator[tuple[Run, dict]]:
        for run in self.runs:
            for record in run.records:
                yield run, record


def _results_dirs(root: Path) -> Iterator[Path]:
    if records_file(root / EVALUATIONS).is_file():
        yield root
    for child in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith('.')):
        yield from _results_dirs(child)


def load_evidence(root: str | Path) -> Evidence:
    """Read every results directory under `root` (a search, a verify run, a campaign, ...), strictly.

    Raises:
        InputError: `root` holds no results directory.
        ResultsError: A record file is damaged before its end, or an identity record is.
    """
    root = Path(root)
    if not root.is_dir():
        raise InputError(f'{root}: no such results directory')
    runs = [
        Run(
            directory,
            read_identity(directory),
            list(iter_jsonl(directory / EVALUATIONS, strict=True)),
            list(iter_jsonl(directory / SUMMARY, strict=True)),
        )
        for directory in _results_dirs(root)
    ]
    if not runs:
        raise InputError(f'{root}: no results directory (no evaluations.jsonl.gz) here or below')
    return Evidence(root, runs)


def judge(criteria: Criteria, evidence: Evidence) -> list[Verdict]:
    """One verdict per criterion, in the file's order."""
    tally = Tally(criteria, str(evidence.root))
    for run in evidence.runs:
        tally.add(run.directory, run.settings, run.records)
    return tally.verdicts()


class Tally:
    """The criteria's evidence gathered as it comes (a results directory's records, or the tester's
    searches one by one), keeping only what the verdicts need; `verdicts()` judges what it holds.

    Args:
        criteria: The criteria.
        where: What the evidence is, for messages.
    """

    def __init__(self, criteria: Criteria, where: str) -> None:
        self.criteria = criteria
        self.where = where
        self.key: str | None = None  # the violation key, once a record says the model's kind
        self.frames: set[str] = set()
        self._inside = {c.id: _Inside() for c in criteria.criteria if c.kind == 'existence'}
        self._samples = {c.id: _Samples() for c in criteria.criteria if c.kind == 'rate'}
        self._regions = {c.id: c.within.space().as_record() for c in criteria.criteria if c.kind == 'rate'}
        self.brackets = Brackets()

    def add(self, directory: Path, settings: dict, records: list[dict]) -> None:
        """Take a batch of evaluation records of one results directory (whose search settings are
        `settings`): a whole directory, or one search.

        Raises:
            InputError: The records are of another kind of model than earlier ones, or were not judged
                at the criteria's threshold.
        """
        for record in records:
            self._take(directory, settings, record)
        if records and self.key is not None:
            self.brackets.add(records, self.key, _space(settings))

    def _take(self, directory: Path, settings: dict, record: dict) -> None:
        self.frames.add(record['image'])
        key = self.criteria.key(record.get('kind') or 'confidence')
        if self.key is None:
            self.key = key
        elif key != self.key:
            raise InputError(
                f'{self.where}: records of count and confidence models together; judge one model'
            )
        if record.get('failed'):
            return
        if key not in (record.get('violation') or {}):
            have = ', '.join(sorted(record.get('violation') or {})) or 'none'
            raise InputError(
                f'{directory}: records judged at thresholds {have}, not at the criteria threshold '
                f'{self.criteria.threshold:g} ({self.criteria.path}); search again with --thresholds '
                'including it'
            )
        violated = bool(record['violation'][key])
        for criterion in self.criteria.criteria:
            if criterion.kind == 'existence' and record.get('order') and _in_claim(criterion, record):
                self._inside[criterion.id].add(directory, record, violated)
            elif criterion.kind == 'rate' and settings.get('algorithm') == 'uniform':
                if settings.get('relations') == self._regions[criterion.id]:
                    self._samples[criterion.id].add(record['image'], violated)

    def verdicts(self) -> list[Verdict]:
        """One verdict per criterion, in the file's order, on the evidence taken so far."""
        out = []
        for c in self.criteria.criteria:
            if c.kind == 'existence':
                out.append(self._inside[c.id].verdict(c, self.key or '?'))
            elif c.kind == 'rate':
                out.append(self._samples[c.id].verdict(c))
            else:
                out.append(_envelope(c, self))
        return out


def _in_claim(criterion: Criterion, record: dict) -> bool:
    if criterion.f_trans_max is not None and record['f_trans'] > criterion.f_trans_max + 1e-12:
        return False
    if criterion.within is None:
        return True
    # A record written before records carried `parameters` cannot be placed in a region.
    return record.get('parameters') is not None and criterion.within.holds(record['parameters'])


def _render_command(directory: Path, record: dict) -> str:
    return (
        f'metavlm render {directory} {record["index"]} --image {record["image"]} '
        f'--algorithm {record["algorithm"]} --seed {record["seed"]}'
    )


@dataclass
class _Inside:
    """An existence claim's evidence: the evaluations in its region, and the smallest violation."""

    evaluations: int = 0
    violations: int = 0
    frames: set[str] = field(default_factory=set)
    algorithms: set[str] = field(default_factory=set)
    smallest: tuple[Path, dict] | None = None

    def add(self, directory: Path, record: dict, violated: bool) -> None:
        self.evaluations += 1
        self.frames.add(record['image'])
        self.algorithms.add(record['algorithm'])
        if violated:
            self.violations += 1
            order = (record['f_trans'], record['image'], record['index'])
            if self.smallest is None or order < _order(self.smallest[1]):
                self.smallest = (directory, record)

    def verdict(self, criterion: Criterion, key: str) -> Verdict:
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
                'render': _render_command(directory, record),
            }
            reason = (
                f'{self.violations} of {self.evaluations} evaluations in the region violate (threshold '
                f'{key}); the smallest, {record["composition"]} at f_trans {record["f_trans"]:.4g} on '
                f'{record["image"]}, is a counterexample'
            )
            return Verdict(criterion.id, criterion.kind, FAIL, criterion.claim, reason, figures, example)
        if not self.evaluations:
            reason = (
                'no evaluation lies in the region: nothing was searched there (metavlm verify searches it)'
            )
            return Verdict(criterion.id, criterion.kind, INCONCLUSIVE, criterion.claim, reason, figures)
        reason = (
            f'none found: no violation among {self.evaluations} evaluations in the region on '
            f'{len(self.frames)} frames ({", ".join(sorted(self.algorithms))}); a search finds violations, '
            'it cannot prove there are none'
        )
        return Verdict(criterion.id, criterion.kind, PASS, criterion.claim, reason, figures)


def _order(record: dict) -> tuple:
    return (record['f_trans'], record['image'], record['index'])


@dataclass
class _Samples:
    """A rate claim's evidence: uniform samples of exactly its region."""

    n: int = 0
    k: int = 0
    frames: set[str] = field(default_factory=set)

    def add(self, image: str, violated: bool) -> None:
        self.n += 1
        self.k += violated
        self.frames.add(image)

    def verdict(self, criterion: Criterion) -> Verdict:
        n, k = self.n, self.k
        figures: dict = {'samples': n, 'violations': k, 'frames': len(self.frames), 'limit': criterion.limit}
        if not n:
            reason = (
                f"no uniform samples of the region ({criterion.within.describe()}): a search's records are "
                'not a random sample; metavlm verify draws them'
            )
            return Verdict(criterion.id, criterion.kind, INCONCLUSIVE, criterion.claim, reason, figures)
        lower, upper = rate_bounds(k, n, criterion.confidence)
        status = judge_rate(k, n, criterion.limit, criterion.confidence)
        figures.update(rate=k / n, lower=lower, upper=upper, confidence=criterion.confidence)
        bounds = (
            f'{k}/{n} = {k / n:.2%} on {len(self.frames)} frames, {criterion.confidence:.0%} bounds '
            f'[{lower:.2%}, {upper:.2%}]'
        )
        if status == PASS:
            reason = f'{bounds}: the upper bound meets the limit {criterion.limit:.2%}'
        elif status == FAIL:
            reason = f'{bounds}: the lower bound is above the limit {criterion.limit:.2%}'
        else:
            more = samples_to_decide(k, n, criterion.limit, criterion.confidence)
            figures['samples_to_decide'] = more
            if more is None:
                tail = 'the observed rate equals the limit: no number of samples decides'
            else:
                tail = f'about {more} more samples would decide if the observed rate held'
            reason = f'{bounds}: the limit {criterion.limit:.2%} lies between them; {tail}'
        return Verdict(criterion.id, criterion.kind, status, criterion.claim, reason, figures)


class Brackets:
    """Each (frame, direction)'s boundary brackets, from batches of records (a directory's, a search's)."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], list[tuple[float, float | None]]] = {}

    def add(self, records: list[dict], key: str, space: SearchSpace, cls: str | None = None) -> None:
        for b in boundaries(records, key, space, cls):
            self._seen.setdefault((b.image, b.direction), []).append((b.clean, b.violating))

    def merged(self) -> dict[tuple[str, str], tuple[float, float | None]]:
        """(frame, direction) -> the tightest bracket of the boundary all batches give together: the
        smallest violating magnitude any found, and the largest violation-free one below it."""
        merged = {}
        for where, brackets in self._seen.items():
            bad = min((v for _, v in brackets if v is not None), default=None)
            clean = max((c for c, _ in brackets if bad is None or c < bad), default=0.0)
            merged[where] = (clean, bad)
        return merged


def _space(settings: dict) -> SearchSpace:
    stored = settings.get('relations')
    return SearchSpace.from_record(stored) if stored else SearchSpace.default()


@dataclass(frozen=True)
class FrameBoundary:
    """A frame's boundary in a criterion's direction(s): it lies in (clean, violating]."""

    image: str
    clean: float
    violating: float | None
    evidence: bool  # False: no single-relation evaluation in that direction on this frame


def merged_boundaries(
    evidence: Evidence, key: str, cls: str | None = None
) -> dict[tuple[str, str], tuple[float, float | None]]:
    """(frame, direction) -> (clean, violating): the tightest bracket all the evidence gives together
    (several searches may have tried a frame's direction); with `cls`, of that class's answer alone."""
    brackets = Brackets()
    for run in evidence.runs:
        brackets.add(run.records, key, _space(run.settings), cls)
    return brackets.merged()


def _frame_boundaries(criterion: Criterion, tally: Tally) -> list[FrameBoundary]:
    sides = ('-', '+') if criterion.direction == 'both' else (criterion.direction,)
    names = [f'{criterion.relation}{side}' for side in sides]
    merged = tally.brackets.merged()
    result = []
    for image in sorted(tally.frames):
        per = [merged[(image, name)] for name in names if (image, name) in merged]
        if len(per) != len(names):
            result.append(FrameBoundary(image, 0.0, None, False))
            continue
        # The frame holds to m in both directions only if it does in each: the smaller boundary.
        bad = [v for _, v in per if v is not None]
        result.append(FrameBoundary(image, min(c for c, _ in per), min(bad) if bad else None, True))
    return result


def _frames_for_a_bound(q: float, confidence: float) -> int:
    """The fewest frames whose smallest value bounds the q-quantile from below at `confidence`."""
    return math.ceil(math.log(1 - confidence) / math.log(1 - q))


def _envelope(criterion: Criterion, tally: Tally) -> Verdict:
    frames = _frame_boundaries(criterion, tally)
    with_evidence = sum(f.evidence for f in frames)
    censored = [f.violating is None for f in frames]
    figures: dict = {
        'frames': len(frames),
        'frames_with_evidence': with_evidence,
        'censored': sum(censored),
        'at_least': criterion.at_least,
        'share': criterion.frames,
    }
    if not with_evidence:
        reason = f'no evaluation of {criterion.relation} alone on any frame (metavlm verify searches them)'
        return Verdict(criterion.id, criterion.kind, INCONCLUSIVE, criterion.claim, reason, figures)
    cleans = [f.clean for f in frames]
    violating = [f.clean if f.violating is None else f.violating for f in frames]
    if criterion.frames >= 1:
        # "On every frame": about these frames only, no population to bound.
        lower = min(cleans)
        upper = min((v for v, c in zip(violating, censored, strict=True) if not c), default=None)
    else:
        q = 1 - criterion.frames
        lower = quantile_bounds(cleans, censored, q, criterion.confidence)[0]
        upper = quantile_bounds(violating, censored, q, criterion.confidence)[1]
    figures.update(lower=lower, upper=upper, confidence=criterion.confidence)
    share = f'{criterion.frames:.0%}'
    if lower is not None and lower >= criterion.at_least:
        status = PASS
        reason = (
            f'on {share} of frames it holds to at least {lower:.4g} ({criterion.confidence:.0%} lower bound)'
        )
    elif upper is not None and upper < criterion.at_least:
        status = FAIL
        reason = f'on more than {1 - criterion.frames:.0%} of frames it breaks by {upper:.4g} (upper bound)'
    else:
        status = INCONCLUSIVE
        shown = lambda v: 'none' if v is None else f'{v:.4g}'  # noqa: E731
        reason = (
            f'bounds [{shown(lower)}, {shown(upper)}] on the boundary {share} of frames clear, from '
            f'{with_evidence} of {len(frames)} frames ({sum(censored)} hold to the searched end)'
        )
        if lower is None and criterion.frames < 1:
            needed = _frames_for_a_bound(1 - criterion.frames, criterion.confidence)
            reason += f'; a lower bound needs at least {needed} frames'
            figures['frames_for_a_lower_bound'] = needed
    return Verdict(criterion.id, criterion.kind, status, criterion.claim, reason, figures)


def envelope_table(
    evidence: Evidence, key: str, confidence: float = 0.95, cls: str | None = None
) -> list[dict]:
    """Per direction the evidence covers: frames, censored, the median and the 5 % quantile of the
    boundary over frames with their order-statistic bounds, the smallest break (the report's table)."""
    by_direction: dict[str, list[tuple[float, float | None]]] = {}
    for (_, direction), bracket in sorted(merged_boundaries(evidence, key, cls).items()):
        by_direction.setdefault(direction, []).append(bracket)
    table = []
    for direction, brackets in by_direction.items():
        cleans = [clean for clean, _ in brackets]
        censored = [bad is None for _, bad in brackets]
        violating = [clean if bad is None else bad for clean, bad in brackets]
        row = {'direction': direction, 'frames': len(brackets), 'censored': sum(censored)}
        for name, q in (('median', 0.5), ('q05', 0.05)):
            row[f'{name}_lower'] = quantile_bounds(cleans, censored, q, confidence)[0]
            row[f'{name}_upper'] = quantile_bounds(violating, censored, q, confidence)[1]
        row['min_violating'] = min((bad for _, bad in brackets if bad is not None), default=None)
        table.append(row)
    order = list(RELATION_BY_ID)
    return sorted(table, key=lambda row: (order.index(row['direction'][:-1]), row['direction'][-1] == '+'))


def envelope_runs(evidence: Evidence) -> list[Run]:
    """The boundary searches among the evidence."""
    return [run for run in evidence.runs if run.settings.get('algorithm') == ENVELOPE]
