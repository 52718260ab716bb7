"""What acceptance criteria and evidence ask `metavlm harden` to train on: the regions the claims cover,
and the changes that broke the model (docs/harden.md)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metavlm_ros.assurance.compare import IMPROVED, REGRESSED, comparison_outcome
from metavlm_ros.assurance.criteria import Criteria
from metavlm_ros.assurance.evidence import Evidence
from metavlm_ros.assurance.workflow import Comparison, Verification, compare_results, verify_frames
from metavlm_ros.common.images import Frame
from metavlm_ros.method.encoding import Composition, SearchSpace
from metavlm_ros.method.relations import RELATION_BY_ID
from metavlm_ros.method.search import SearchConfig, searched_frame
from metavlm_ros.training.followups import TrainingRegion

__all__ = ['ENVELOPE_MARGIN', 'Gate', 'run_gate', 'training_regions', 'violating_changes']

#: An envelope claim trains on its relation out to this many times the claimed boundary: a model
#: trained exactly to the claim holds it on about half the frames, not on the share the claim asks.
ENVELOPE_MARGIN = 1.5


def _envelope_space(relation_id: str, direction: str, at_least: float) -> SearchSpace:
    relation = RELATION_BY_ID[relation_id]
    reach = at_least * ENVELOPE_MARGIN
    low = relation.nominal - reach if direction in ('both', '-') else relation.nominal
    high = relation.nominal + reach if direction in ('both', '+') else relation.nominal
    low, high = max(low, relation.low), min(high, relation.high)
    return SearchSpace.from_options(enabled=[relation_id], ranges={relation_id: (low, high)})


def training_regions(criteria: Criteria) -> list[TrainingRegion]:
    """One training region per claim: an existence claim's region (or the paper's space) up to its
    f_trans_max, a rate claim's region, and an envelope claim's relation out to ENVELOPE_MARGIN times
    its boundary on the sides it claims."""
    regions = []
    for criterion in criteria.criteria:
        within = getattr(criterion, 'within', None)
        if criterion.kind == 'envelope':
            space = _envelope_space(criterion.relation, criterion.direction, criterion.at_least)
            regions.append(TrainingRegion(criterion.id, space))
        elif within is not None or getattr(criterion, 'f_trans_max', None) is not None:
            space = within.space() if within is not None else SearchSpace.default()
            regions.append(TrainingRegion(criterion.id, space, getattr(criterion, 'f_trans_max', None)))
    return regions


def violating_changes(evidence: Iterable[Evidence], key: str) -> list[Composition]:
    """The compositions of every evaluation that violated at `key` (a threshold's key) in the evidence,
    in the order the records hold them."""
    changes = []
    for one in evidence:
        for run in one.runs:
            for record in run.records:
                if record.get('failed') or not (record.get('violation') or {}).get(key):
                    continue
                if record.get('parameters'):
                    changes.append(Composition.from_parameters(record['parameters']))
    return changes


@dataclass(frozen=True)
class Gate:
    """The tool's own gate on held-out frames: each criterion's status for the base and the hardened
    model, the comparison's items, and clean accuracy on the held-out frames in `measure` (None: no ground
    truth, or too few frames)."""

    base: Verification
    hardened: Verification
    comparison: Comparison
    accuracy: dict[str, float | None]
    measure: str = 'presence AUC'

    @property
    def regressed(self) -> bool:
        return bool(self.comparison.regressions)

    def as_record(self) -> dict:
        """The gate as the model card holds it."""
        theirs = {v.criterion: v.status for v in self.hardened.verdicts}
        changes = self.comparison.changes
        improved = sum(c.verdict == IMPROVED for c in changes)
        regressed = sum(c.verdict == REGRESSED for c in changes)
        return {
            'summary': (
                f'metavlm verify: {self.base.outcome} (base) -> {self.hardened.outcome} (hardened); '
                f'metavlm compare: {comparison_outcome(changes)} ({improved} of {len(changes)} items '
                f'improved, {regressed} regressed); {self.measure} on the held-out frames '
                f'{_figure(self.accuracy["base"])} -> {_figure(self.accuracy["hardened"])}'
            ),
            'outcome': {'base': self.base.outcome, 'hardened': self.hardened.outcome},
            'criteria': [
                {'criterion': v.criterion, 'base': v.status, 'hardened': theirs.get(v.criterion, '')}
                for v in self.base.verdicts
            ],
            'changes': [
                {
                    'item': c.item,
                    'effect_text': c.effect_text,
                    'verdict': c.verdict,
                    'p_adjusted': c.p_adjusted,
                }
                for c in changes
            ],
            'comparison': comparison_outcome(changes),
            'accuracy': dict(self.accuracy),
            'accuracy_measure': self.measure,
        }


def _figure(value: float | None) -> str:
    return 'not measured (no ground truth, or too few frames)' if value is None else f'{value:.3f}'


def run_gate(
    criteria: Criteria,
    frames: Sequence[Frame],
    backends: Mapping[str, tuple[Any, dict]],
    out: Path,
    *,
    truths: Callable[[Sequence[Frame], Sequence[Any], Sequence[str]], Sequence[Any]],
    log: Callable[[str], None] = print,
    **search: Any,
) -> Gate:
    """Verify the base and the hardened model on the same held-out frames with the same plan and seed
    (out/verify-base, out/verify-hardened), compare them (out/compare), and measure each one's clean
    accuracy against the ground truth (`training.validation.clean_accuracy`).

    Args:
        backends: 'base' and 'hardened' -> (backend, model identity).
        truths: (frames, the frames as the model is asked them, classes) -> each frame's FrameTruth or
            None (footage without ground truth).
        search: verify_frames' search settings (population, evaluations, seed, working_size,
            envelope_rounds).
    """
    from metavlm_ros.training.validation import clean_accuracy

    done = {}
    accuracy: dict[str, float | None] = {}
    measure = ''
    for name, (backend, identity) in backends.items():
        log(f'gate: metavlm verify of the {name} model on {len(frames)} held-out frame(s)')
        done[name] = verify_frames(
            criteria, frames, backend, identity, out / f'verify-{name}', log=log, **search
        )
        prepared = [searched_frame(f.rgb, SearchConfig(), backend) for f in frames]
        answers = backend.predict(prepared)
        measure, accuracy[name] = clean_accuracy(
            answers, truths(frames, prepared, backend.classes), backend.classes, prepared
        )
    comparison = compare_results(out / 'verify-base', out / 'verify-hardened', out / 'compare')
    return Gate(done['base'], done['hardened'], comparison, accuracy, measure)
