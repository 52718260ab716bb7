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
from metavlm_ros.method.envelope import Boundary, boundaries
from metavlm_ros.method.relations import RELATION_BY_ID

__all__ = ['Evidence', 'Run', 'envelope_table', 'judge', 'load_evidence']


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
    key = criteria.key(evidence.kind)
    _check_key(evidence, key, criteria)
    judges = {'existence': _existence, 'rate': _rate, 'envelope': _envelope}
    return [judges[c.kind](c, evidence, key) for c in criteria.criteria]


def _check_key(evidence: Evidence, key: str, criteria: Criteria) -> None:
    for run, record in evidence.evaluations():
        if not record.get('failed') and key not in (record.get('violation') or {}):
            have = ', '.join(sorted(record.get('violation') or {})) or 'none'
            raise InputError(
                f'{run.directory}: records judged at thresholds {have}, not at the criteria threshold '
                f'{criteria.threshold:g} ({criteria.path}); search again with --thresholds including it'
            )


def _render_command(run: Run, record: dict, root: Path) -> str:
    return (
        f'metavlm render {run.directory} {record["index"]} --image {record["image"]} '
        f'--algorithm {record["algorithm"]} --seed {record["seed"]}'
    )


def _existence(criterion: Criterion, evidence: Evidence, key: str) -> Verdict:
    inside: list[tuple[Run, dict]] = []
    for run, record in evidence.evaluations():
        if record.get('failed') or not record.get('order'):
            continue
        if criterion.f_trans_max is not None and record['f_trans'] > criterion.f_trans_max + 1e-12:
            continue
        if criterion.within is not None and not criterion.within.holds(record.get('parameters') or {}):
            continue
        inside.append((run, record))
    frames = sorted({r['image'] for _, r in inside})
    broken = [(run, r) for run, r in inside if r['violation'].get(key)]
    figures = {'evaluations_in_region': len(inside), 'frames': len(frames), 'violations': len(broken)}
    if broken:
        # The smallest change that breaks the claim: the one an engineer looks at first.
        run, record = min(broken, key=lambda pair: (pair[1]['f_trans'], pair[1]['image'], pair[1]['index']))
        example = {
            'directory': str(run.directory),
            **{
                k: record.get(k) for k in ('image', 'index', 'algorithm', 'seed', 'composition', 'parameters')
            },
            **{k: record.get(k) for k in ('f_trans', 'f_pred', 'source', 'followup', 'frame_sha256')},
            'render': _render_command(run, record, evidence.root),
        }
        reason = (
            f'{len(broken)} of {len(inside)} evaluations in the region violate (threshold {key}); the '
            f'smallest, {record["composition"]} at f_trans {record["f_trans"]:.4g} on {record["image"]}, '
            'is a counterexample'
        )
        return Verdict(criterion.id, criterion.kind, FAIL, criterion.claim, reason, figures, example)
    if not inside:
        reason = (
            'no evaluation lies in the region: nothing was searched there (search it, e.g. metavlm verify)'
        )
        return Verdict(criterion.id, criterion.kind, INCONCLUSIVE, criterion.claim, reason, figures)
    algorithms = sorted({r['algorithm'] for _, r in inside})
    reason = (
        f'none found: no violation among {len(inside)} evaluations in the region on {len(frames)} frames '
        f'({", ".join(algorithms)}); a search finds violations, it cannot prove there are none'
    )
    return Verdict(criterion.id, criterion.kind, PASS, criterion.claim, reason, figures)


def _rate(criterion: Criterion, evidence: Evidence, key: str) -> Verdict:
    region = criterion.within.space().as_record()
    samples = [
        r
        for run in evidence.runs
        if run.settings.get('algorithm') == 'uniform' and run.settings.get('relations') == region
        for r in run.records
        if not r.get('failed')
    ]
    n, k = len(samples), sum(bool(r['violation'].get(key)) for r in samples)
    frames = len({r['image'] for r in samples})
    figures: dict = {'samples': n, 'violations': k, 'frames': frames, 'limit': criterion.limit}
    if not n:
        reason = (
            f"no uniform samples of the region ({criterion.within.describe()}): a search's records are not a "
            'random sample; metavlm verify draws them'
        )
        return Verdict(criterion.id, criterion.kind, INCONCLUSIVE, criterion.claim, reason, figures)
    lower, upper = rate_bounds(k, n, criterion.confidence)
    status = judge_rate(k, n, criterion.limit, criterion.confidence)
    figures.update(rate=k / n, lower=lower, upper=upper, confidence=criterion.confidence)
    bounds = (
        f'{k}/{n} = {k / n:.2%} on {frames} frames, {criterion.confidence:.0%} bounds '
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


@dataclass(frozen=True)
class FrameBoundary:
    """A frame's boundary in a criterion's direction(s): it lies in (clean, violating]."""

    image: str
    clean: float
    violating: float | None
    evidence: bool  # False: no single-relation evaluation in that direction on this frame


def merged_boundaries(evidence: Evidence, key: str) -> dict[tuple[str, str], tuple[float, float | None]]:
    """(frame, direction) -> (clean, violating): the tightest bracket all the evidence gives together
    (several searches may have tried a frame's direction): the smallest violating magnitude any found,
    and the largest violation-free one below it."""
    found: dict[tuple[str, str], list[Boundary]] = {}
    for run in evidence.runs:
        for b in boundaries(run.records, key, run.space):
            found.setdefault((b.image, b.direction), []).append(b)
    merged = {}
    for where, bs in found.items():
        bad = min((b.violating for b in bs if b.violating is not None), default=None)
        clean = max((b.clean for b in bs if bad is None or b.clean < bad), default=0.0)
        merged[where] = (clean, bad)
    return merged


def _frame_boundaries(criterion: Criterion, evidence: Evidence, key: str) -> list[FrameBoundary]:
    sides = ('-', '+') if criterion.direction == 'both' else (criterion.direction,)
    names = [f'{criterion.relation}{side}' for side in sides]
    merged = merged_boundaries(evidence, key)
    result = []
    for image in evidence.frames:
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


def _envelope(criterion: Criterion, evidence: Evidence, key: str) -> Verdict:
    frames = _frame_boundaries(criterion, evidence, key)
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


def envelope_table(evidence: Evidence, key: str, confidence: float = 0.95) -> list[dict]:
    """Per direction the evidence covers: frames, censored, the median and the 5 % quantile of the
    boundary over frames with their order-statistic bounds, the smallest break (the report's table)."""
    by_direction: dict[str, list[tuple[float, float | None]]] = {}
    for (_, direction), bracket in sorted(merged_boundaries(evidence, key).items()):
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
