"""Comparing two model versions on the same evidence plan: paired tests per relation and direction, per
rate region and per search, Holm's correction, a minimum effect, and a verdict per item."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats as scipy_stats

from metavlm_ros.assurance.evidence import Evidence, Run
from metavlm_ros.assurance.judge import condition_boundaries, row_label
from metavlm_ros.assurance.stats import holm, mcnemar_exact, wilcoxon_paired
from metavlm_ros.common.errors import InputError
from metavlm_ros.method.algorithms import ENVELOPE
from metavlm_ros.method.answers import iou_key
from metavlm_ros.method.boxes import DEFAULT_IOU_THRESHOLD
from metavlm_ros.method.envelope import directions
from metavlm_ros.method.metrics import threshold_key
from metavlm_ros.method.stats import a12, a12_magnitude, mann_whitney_p

__all__ = [
    'ALPHA',
    'MIN_A12_SHIFT',
    'MIN_BOUNDARY_SHIFT',
    'MIN_RATE_SHIFT',
    'Change',
    'IMPROVED',
    'NO_CHANGE',
    'REGRESSED',
    'compare',
    'comparable_key',
    'comparison_outcome',
]

REGRESSED, IMPROVED, NO_CHANGE = 'regressed', 'improved', 'no significant change'
#: Family-wise error rate across every item of one comparison (Holm-Bonferroni).
ALPHA = 0.05
#: Smallest changes called: the median boundary shift as a share of the direction's range, the
#: violation rate in points (0.05: 5 percentage points), and |A12 - 0.5| of the hypervolumes (the
#: paper's "negligible" band ends at 0.56).
MIN_BOUNDARY_SHIFT = 0.05
MIN_RATE_SHIFT = 0.05
MIN_A12_SHIFT = 0.06


@dataclass
class Change:
    """One item compared: what, the test, its raw and Holm-adjusted p-value, the effect, the verdict."""

    item: str
    kind: str
    test: str
    p: float
    effect: float
    effect_text: str
    worse: bool  # the effect points to the candidate being less robust
    large_enough: bool
    p_adjusted: float = 1.0
    verdict: str = NO_CHANGE
    figures: dict[str, Any] = field(default_factory=dict)


def _runs(evidence: Evidence) -> dict[str, Run]:
    return {run.label(evidence.root): run for run in evidence.runs}


def _flat(value: Any, prefix: str = '') -> dict[str, Any]:
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flat(item, f'{prefix}{key}.'))
        return out
    return {prefix.rstrip('.'): value}


def _frames(run: Run) -> dict[str, str]:
    found = {r['image']: r.get('frame_sha256') or '' for r in run.records}
    found.update({s['image']: s['source_sha256'] for s in run.summaries if s.get('source_sha256')})
    return found


#: The parts of a search's identity record that must agree (but the seed): the model's name, weights
#: and what its backend adds may differ, being the change compared.
_COMPARED = ('settings', 'source', 'model.options')


def _part(identity: Mapping[str, Any] | None, part: str) -> Any:
    value: Any = identity or {}
    for key in part.split('.'):
        value = (value or {}).get(key) if isinstance(value, Mapping) else None
    return value or {}


#: The fields of two campaigns' campaign.json that may differ, with a note: the base seed (as a
#: search's) and the torch threads per cell (they move floating-point sums in the last digit, not what
#: is asked).
_CAMPAIGN_NOTED = ('config.seed', 'config.threads')
#: The fields that may differ without a note. `config.models` (each model's `model` path or id, name,
#: backend, and device and batch size, which change no answer) is what a comparison compares: its
#: options are held equal through the identity records (`models.<i>.options`, the backend's
#: `identity` options, as a search's `model.options`); the weights and what the backend adds may
#: differ. `config.frames.sources` are paths on the machine that ran it (the frames are compared by
#: sha256: `images.<id>`); `config.baseline` and `config.pareto_pngs` change no cell (they are
#: outside the fingerprint). Everything else in `config` (algorithms, runs, population,
#: evaluations, thresholds, relations, warp, working_size, the frames' selection) must agree; the
#: record's bookkeeping (version, fingerprint, created, invocations, cells) is not compared.
_CAMPAIGN_FREE = ('config.models', 'config.frames.sources', 'config.baseline', 'config.pareto_pngs')


def _campaign_fields(root: Path) -> dict[str, Any] | None:
    """The fields of a campaign root's campaign.json that a comparison holds (None: not a campaign)."""
    from metavlm_ros.campaign.cells import CAMPAIGN_FILE, read_campaign

    if not (root / CAMPAIGN_FILE).is_file():
        return None
    record = read_campaign(root)
    fields = {
        key: value
        for key, value in _flat(record.get('config') or {}, 'config.').items()
        if not any(key == free or key.startswith(f'{free}.') for free in _CAMPAIGN_FREE)
    }
    for i, model in enumerate(record.get('models') or []):
        fields.update(_flat((model or {}).get('options') or {}, f'models.{i}.options.'))
    for image in record.get('images') or []:
        fields[f'images.{image.get("id")}'] = image.get('sha256')
    return fields


def _campaign_notes(base: Path, candidate: Path) -> list[str]:
    """The notes on two roots' campaign.json (none when neither is a campaign); raises where they differ
    in a field a comparison holds (`_CAMPAIGN_FREE`) or one root only is a campaign."""
    left, right = _campaign_fields(base), _campaign_fields(candidate)
    if left is None and right is None:
        return []
    if left is None or right is None:
        side, other = ('BASE', 'CANDIDATE') if right is None else ('CANDIDATE', 'BASE')
        raise InputError(f'not comparable: {side} is a campaign (campaign.json), {other} is not')
    notes = []
    for key in sorted(set(left) | set(right)):
        if left.get(key) != right.get(key):
            said = f'campaign.json {key} is {left.get(key)!r} in BASE, {right.get(key)!r} in CANDIDATE'
            if key not in _CAMPAIGN_NOTED:
                raise InputError(f'not comparable: {said}')
            notes.append(said)
    return notes


def comparable_key(base: Evidence, candidate: Evidence, threshold: float | None) -> tuple[str, list[str]]:
    """The violation key both are compared at, and the differences allowed (notes); raises when the two
    are not comparable.

    Raises:
        InputError: The searches, their settings (but the seed), the model's options, how frames reached
            the model, or the frames themselves (by sha256) differ, or, of two campaigns, their
            configurations (`_CAMPAIGN_FREE`), or one root only is a campaign; the message names the
            first difference.
    """
    # Campaign cells carry no search.json: the campaign's configuration stands for their settings.
    notes = _campaign_notes(base.root, candidate.root)
    ours, theirs = _runs(base), _runs(candidate)
    if set(ours) != set(theirs):
        only = sorted(set(ours) ^ set(theirs))[0]
        side = 'BASE' if only in ours else 'CANDIDATE'
        raise InputError(f'not comparable: {only} is in {side} only (the same verify or search plan on both)')
    for label in sorted(ours):
        a, b = ours[label], theirs[label]
        # The options too: the model may change, not what it is asked nor how (prompts, questions,
        # answer kind, vocabulary, image processor, dtype, ...: the backend's `identity` options).
        for part in _COMPARED:
            left, right = _flat(_part(a.identity, part)), _flat(_part(b.identity, part))
            for key in sorted(set(left) | set(right)):
                if left.get(key) != right.get(key):
                    if key == 'seed':
                        notes.append(f'{label}: seed {left.get(key)} in BASE, {right.get(key)} in CANDIDATE')
                        continue
                    raise InputError(
                        f'not comparable: {label}: {part}.{key} is {left.get(key)!r} in BASE, '
                        f'{right.get(key)!r} in CANDIDATE'
                    )
        fa, fb = _frames(a), _frames(b)
        for image in sorted(set(fa) | set(fb)):
            if fa.get(image) != fb.get(image):
                raise InputError(
                    f'not comparable: {label}: frame {image} is {fa.get(image) or "missing"} (sha256) in '
                    f'BASE, {fb.get(image) or "missing"} in CANDIDATE'
                )
    kinds = {base.kind, candidate.kind}
    if len(kinds) > 1:
        raise InputError('not comparable: a count model and a confidence model')
    if kinds == {'count'}:
        return 'count', notes
    if kinds == {'detection'}:
        found = {run.settings.get('iou_threshold', DEFAULT_IOU_THRESHOLD) for run in base.runs}
        if len(found) != 1:
            raise InputError(
                f'the searches judged boxes at IoU thresholds {", ".join(map(str, sorted(found)))}'
            )
        return iou_key(found.pop()), notes
    if threshold is None:
        found = {t for run in base.runs for t in (run.settings.get('thresholds') or [])}
        # A campaign's cells carry no settings of their own: its campaign.json names the thresholds.
        found = found or set((_campaign_fields(base.root) or {}).get('config.thresholds') or [])
        if len(found) != 1:
            judged = (
                f'judged at thresholds {", ".join(map(str, sorted(found)))}' if found else 'name no threshold'
            )
            raise InputError(f'the searches {judged}: choose one with --threshold')
        threshold = found.pop()
    return threshold_key(threshold), notes


def _envelope_changes(base: Evidence, candidate: Evidence, key: str) -> list[Change]:
    ends: dict[str, float] = {}
    for run in base.runs:
        if run.settings.get('algorithm') == ENVELOPE:
            ends.update({d.name: d.end for d in directions(run.space)})
    if not ends:
        return []
    # The boundary searches only: deterministic, so the same model gives the same boundaries whatever
    # the seed (other searches' single-relation evaluations depend on it). MR12's per water (the
    # condition it was searched at): 2 m in Jerlov 9C and 10 m in Jerlov I are no one boundary.
    ours, theirs = (
        condition_boundaries(
            Evidence(e.root, [r for r in e.runs if r.settings.get('algorithm') == ENVELOPE]), key
        )
        for e in (base, candidate)
    )
    order = list(ends)
    rows = sorted(
        {(d, c) for _, d, c in ours if d in ends},
        key=lambda row: (order.index(row[0]), () if row[1] is None else row[1].ranges),
    )
    changes = []
    for direction, condition in rows:
        end = ends[direction]
        images = sorted(
            image
            for image, d, c in ours
            if (d, c) == (direction, condition) and (image, direction, condition) in theirs
        )
        if not images:
            continue
        # Each frame's boundary as one number (`Bracket.point`): one held to the range's end counts as it.
        a = [ours[(image, direction, condition)].point for image in images]
        b = [theirs[(image, direction, condition)].point for image in images]
        _, p = wilcoxon_paired(a, b)
        shift = float(np.median(np.subtract(b, a)))
        changes.append(
            Change(
                item=f'{row_label(direction, condition)} boundary',
                kind='envelope',
                test=f'Wilcoxon signed-rank, paired over {len(images)} frames',
                p=p,
                effect=shift / end,
                effect_text=f'median shift {shift:+.4g} ({shift / end:+.1%} of the range)',
                worse=shift < 0,
                large_enough=abs(shift) >= MIN_BOUNDARY_SHIFT * end,
                figures={
                    'frames': len(images),
                    'base_median': float(np.median(a)),
                    'candidate_median': float(np.median(b)),
                },
            )  # fmt: skip
        )
    return changes


def _rate_changes(base: Evidence, candidate: Evidence, key: str) -> list[Change]:
    ours, theirs = _runs(base), _runs(candidate)
    changes = []
    for label, run in sorted(ours.items()):
        if run.settings.get('algorithm') != 'uniform':
            continue
        mine = {(r['image'], r['index']): r for r in run.records if not r.get('failed')}
        other = {(r['image'], r['index']): r for r in theirs[label].records if not r.get('failed')}
        pairs = [(mine[k], other[k]) for k in sorted(set(mine) & set(other))]
        if not pairs:
            continue
        n = len(pairs)
        paired = all(a['genotype'] == b['genotype'] for a, b in pairs)
        va = [bool(a['violation'].get(key)) for a, _ in pairs]
        vb = [bool(b['violation'].get(key)) for _, b in pairs]
        if paired:
            # The same samples judged by both models: the discordant pairs decide (exact McNemar).
            only_base = sum(x and not y for x, y in zip(va, vb, strict=True))
            only_candidate = sum(y and not x for x, y in zip(va, vb, strict=True))
            p = mcnemar_exact(only_base, only_candidate)
            test = (
                f'exact McNemar, {n} paired samples ({only_base} base only, {only_candidate} candidate only)'
            )
        else:
            # Other samples (another seed): the two rates compared unpaired (Fisher's exact test).
            table = [[sum(va), n - sum(va)], [sum(vb), n - sum(vb)]]
            p = float(scipy_stats.fisher_exact(table).pvalue)
            test = f'Fisher exact, {n} samples each (unpaired: the samples differ)'
        shift = (sum(vb) - sum(va)) / n
        changes.append(
            Change(
                item=f'violation rate of {label}',
                kind='rate',
                test=test,
                p=min(p, 1.0),
                effect=shift,
                effect_text=f'{sum(va) / n:.1%} -> {sum(vb) / n:.1%} ({shift * 100:+.1f} points)',
                worse=shift > 0,
                large_enough=abs(shift) >= MIN_RATE_SHIFT,
                figures={'samples': n, 'base_violations': sum(va), 'candidate_violations': sum(vb)},
            )
        )
    return changes


def _hypervolume_changes(base: Evidence, candidate: Evidence) -> list[Change]:
    ours, theirs = _runs(base), _runs(candidate)
    changes = []
    for label, run in sorted(ours.items()):
        if run.settings.get('algorithm') in ('uniform', ENVELOPE):
            continue
        a = [s['hypervolume'] for s in run.summaries if not s.get('stopped')]
        b = [s['hypervolume'] for s in theirs[label].summaries if not s.get('stopped')]
        if not a or not b:
            continue
        p, value = mann_whitney_p(b, a), a12(b, a)
        changes.append(
            Change(
                item=f'hypervolume of {label}',
                kind='hypervolume',
                test=f"Mann-Whitney U, A12 (the paper's RQ1), {len(a)} and {len(b)} searches",
                p=p,
                effect=value,
                effect_text=(
                    f'A12 {value:.3f} ({a12_magnitude(value)}); medians {np.median(a):.4f} -> '
                    f'{np.median(b):.4f}'
                ),
                worse=value > 0.5,  # a larger hypervolume: smaller changes change the answer more
                large_enough=abs(value - 0.5) >= MIN_A12_SHIFT,
                figures={'base_median': float(np.median(a)), 'candidate_median': float(np.median(b))},
            )
        )
    return changes


def compare(
    base: Evidence, candidate: Evidence, *, threshold: float | None = None, alpha: float = ALPHA
) -> tuple[list[Change], list[str]]:
    """Every item compared, with Holm-adjusted p-values and verdicts; and the notes on what differed.

    Raises:
        InputError: The two are not comparable (see `comparable_key`).
    """
    key, notes = comparable_key(base, candidate, threshold)
    changes = [
        *_envelope_changes(base, candidate, key),
        *_rate_changes(base, candidate, key),
        *_hypervolume_changes(base, candidate),
    ]
    for change, adjusted in zip(changes, holm([c.p for c in changes]), strict=True):
        change.p_adjusted = adjusted
        if adjusted < alpha and change.large_enough and not math.isnan(change.effect):
            change.verdict = REGRESSED if change.worse else IMPROVED
        frames = change.figures.get('frames')
        if change.kind == 'envelope' and change.verdict == NO_CHANGE and change.large_enough and frames:
            # Every frame moved one way and still no call: too few frames for this test, not no change.
            needed = _frames_to_call(len(changes), alpha)
            if frames < needed and change.p <= 2 / 2**frames + 1e-12:
                notes.append(
                    f'{change.item}: all {frames} frames moved the same way ({change.effect_text}), but a '
                    f"paired test on {frames} frames cannot reach {alpha:g} after Holm's correction over "
                    f'{len(changes)} items; verify on at least {needed} frames to decide it'
                )
    return changes, notes


def comparison_outcome(changes: list[Change]) -> str:
    """The gate's word for a comparison: 'REGRESSED' when any item regressed (whatever else improved),
    else 'IMPROVED' when any item improved, else 'no regression'."""
    verdicts = {change.verdict for change in changes}
    return 'REGRESSED' if REGRESSED in verdicts else 'IMPROVED' if IMPROVED in verdicts else 'no regression'


def _frames_to_call(items: int, alpha: float) -> int:
    """The fewest frames on which a Wilcoxon signed-rank test of every frame moving one way (exact
    two-sided p 2 / 2**n) reaches `alpha` even as the first of `items` Holm-adjusted p-values."""
    n = 1
    while items * 2 / 2**n >= alpha:
        n += 1
    return n
