"""One `metavlm harden`: plan the follow-ups from criteria and evidence, train, save the model with its
card, and run the gate on held-out frames (docs/harden.md)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from metavlm_ros.assurance.criteria import Criteria
from metavlm_ros.assurance.evidence import load_evidence
from metavlm_ros.assurance.hardening import Gate, run_gate, training_regions, violating_changes
from metavlm_ros.assurance.workflow import checked_evidence
from metavlm_ros.common.directories import sha256_file
from metavlm_ros.common.errors import InputError, ParameterError
from metavlm_ros.common.images import Frame
from metavlm_ros.footage.frames import frame_digest
from metavlm_ros.footage.ground_truth import GroundTruthLookup, true_detections
from metavlm_ros.footage.ranges import RangeLookup, missing_ranges
from metavlm_ros.method.answers import Thresholds, answer_for
from metavlm_ros.method.search import SearchConfig, prepare_frame
from metavlm_ros.models.vlm import create_backend, model_identity
from metavlm_ros.training.card import CARD, card_record, save_model, write_card
from metavlm_ros.training.followups import FollowupPlan
from metavlm_ros.training.harden import CHECKPOINT, HardenSettings, TrainingFrame, harden
from metavlm_ros.training.validation import FrameTruth

__all__ = ['HardenJob', 'HardenOutcome', 'harden_model']


@dataclass(frozen=True)
class HardenJob:
    """What to harden, with what, into where, and how the gate searches (verify_frames' settings)."""

    backend: str
    model: str
    options: dict
    out: Path
    criteria: Criteria
    results: tuple[Path, ...] = ()
    settings: HardenSettings = field(default_factory=HardenSettings)
    resume: bool = False
    gate_search: dict = field(default_factory=dict)


@dataclass(frozen=True)
class HardenOutcome:
    """The card's record, the gate (None without one) and a summary to print."""

    card: dict
    gate: Gate | None
    summary: str

    @property
    def regressed(self) -> bool:
        return self.gate is not None and self.gate.regressed


def _check_out(out: Path, resume: bool) -> None:
    if (out / CARD).exists():
        raise ParameterError(f'--out {out}: holds a hardened model already; name a new directory')
    if resume and not (out / CHECKPOINT).is_file():
        raise ParameterError(f'--resume: no {CHECKPOINT} under {out} to continue from')
    if not resume and out.exists():
        raise ParameterError(f'--out {out}: exists; name a new directory (or --resume a killed run)')


def _truths(frames: Sequence[Frame], prepared: Sequence[np.ndarray], classes: Sequence[str]) -> list:
    """Each frame's ground truth at the size the model is asked at (FrameTruth; None: none)."""
    lookup = GroundTruthLookup()
    truths = []
    for frame, rgb in zip(frames, prepared, strict=True):
        truth = lookup(frame)
        if truth is None:
            truths.append(None)
            continue
        boxes = true_detections(truth, rgb.shape[1] / frame.rgb.shape[1])
        truths.append(FrameTruth(tuple(truth.counts.get(c, 0) > 0 for c in classes), tuple(boxes)))
    return truths


def training_frames(frames: Sequence[Frame], backend, water_ranges: str = 'prior') -> list[TrainingFrame]:
    """The frames as the search sees them (working size), with their ground truth and, where MR12 takes
    the footage's ranges (the criteria's `water_ranges: truth`), their range maps at that size: the
    training follow-ups are made as the gate's searches make them.

    Raises:
        InputError: a frame without a range map where the criteria want them (one line naming it).
    """
    config = dataclasses.replace(SearchConfig(), water_ranges=water_ranges)
    lookup = RangeLookup()
    prepared = []
    for f in frames:
        ranges = lookup(f) if water_ranges == 'truth' else None
        if water_ranges == 'truth' and ranges is None:
            raise missing_ranges(f, lookup)
        prepared.append(prepare_frame(f.rgb, config, getattr(backend, 'input_size', 0), ranges))
    rgbs = [p.rgb for p in prepared]
    truths = _truths(frames, rgbs, backend.classes)
    return [
        TrainingFrame(f.id, p.rgb, frame_digest(p.rgb), truth, p.ranges)
        for f, p, truth in zip(frames, prepared, truths, strict=True)
    ]


def _evidence_record(roots: Sequence[Path]) -> list[dict]:
    """Each evidence root with the sha256 of every file of records it holds."""
    record = []
    for root in roots:
        files = sorted(p for p in root.rglob('*.jsonl*') if p.is_file())
        record.append({'root': str(root), 'files': {str(p.relative_to(root)): sha256_file(p) for p in files}})
    return record


def harden_model(
    job: HardenJob,
    frames: Sequence[Frame],
    heldout: Sequence[Frame] | None,
    *,
    log: Callable[[str], None] = print,
) -> HardenOutcome:
    """Harden `job.model` on `frames` and gate it on `heldout` (None: no gate).

    Raises:
        ParameterError: --out exists (or holds no checkpoint to resume), a bad setting.
        InputError: Too few frames, evidence that fails its SHA256SUMS, no held-out frame.
    """
    from tqdm import tqdm

    job.settings.validate()
    _check_out(job.out, job.resume)
    if heldout is not None and not heldout:
        raise InputError('--heldout selects no frame')
    for root in job.results:
        checked_evidence(root)  # a damaged or altered root is refused before anything is trained
    evidence = [load_evidence(root) for root in job.results]
    backend = create_backend(job.backend, job.model, **job.options)
    # The evidence's violations by the key of the model's kind of answer, at the training thresholds
    # (a count's 'count', a confidence's threshold, boxes' IoU threshold).
    thresholds = Thresholds((job.settings.threshold,), job.settings.iou_threshold)
    key = answer_for(getattr(backend, 'kind', 'confidence')).refining_key(thresholds)
    plan = FollowupPlan.of(training_regions(job.criteria), violating_changes(evidence, key))
    base = {**model_identity(job.backend, job.model, job.options), 'weights_sha256': backend.weights_hash()}
    training = training_frames(frames, backend, job.criteria.water_ranges)
    if job.criteria.water_ranges == 'truth':  # the gate's searches need them too: refused before training
        lookup = RangeLookup()
        missing = next(filter(None, (missing_ranges(f, lookup) for f in heldout or ())), None)
        if missing is not None:
            raise missing
    log(
        f'harden: {len(training)} frame(s), {len(plan.regions)} region(s) from {job.criteria.path.name}, '
        f'{len(plan.broken)} breaking change(s) from {len(job.results)} evidence root(s)'
    )
    with tqdm(total=job.settings.steps, desc='harden', unit='step', leave=False) as bar:

        def progress(step: int, steps: int, loss: float) -> None:
            bar.n = step
            bar.set_postfix(loss=f'{loss:.3g}', refresh=False)
            bar.refresh()

        hardened = harden(
            backend, training, plan, job.out, job.settings, resume=job.resume, progress=progress
        )
    weights = save_model(backend, job.out)
    record = card_record(
        base=base,
        model={'name': job.out.name, 'path': str(job.out), 'weights_sha256': weights},
        frames={'train': hardened.train, 'validation': hardened.validation},
        evidence=_evidence_record(job.results),
        criteria={'path': str(job.criteria.path), 'sha256': job.criteria.sha256},
        plan=plan.as_record(),
        settings=dataclasses.asdict(job.settings),
        training={
            'method': hardened.method,
            'steps': job.settings.steps,
            'trainable_parameters': hardened.trainable_parameters,
            'resumed_at': hardened.resumed_at,
            'seconds': round(hardened.seconds, 1),
            'loss': {'first': hardened.losses[0], 'last': hardened.losses[-1], 'every_step': hardened.losses},
            'alpha': hardened.alpha,
            'notes': hardened.notes,
        },
        validation={f'{a:g}': f.as_record() for a, f in hardened.blends.items()},
    )
    write_card(job.out, record)
    lines = [
        f'hardened: {job.out} ({hardened.method}, blend {hardened.alpha:g}); validation violation rate '
        f'{hardened.before.violation_rate:.1%} -> {hardened.after.violation_rate:.1%}'
    ]
    gate = None
    if heldout is not None:
        del backend  # the gate loads both models afresh, from disk
        options = job.options
        backends = {
            'base': (create_backend(job.backend, job.model, **options), base),
            'hardened': (
                create_backend(job.backend, str(job.out), **options),
                model_identity(job.backend, str(job.out), options),
            ),
        }
        gate = run_gate(
            job.criteria, heldout, backends, job.out / 'gate', truths=_truths, log=log, **job.gate_search
        )
        record = {**record, 'frames': {**record['frames'], 'heldout': [frame_digest(f.rgb) for f in heldout]}}
        record['gate'] = gate.as_record()
        write_card(job.out, record)
        lines.append(record['gate']['summary'])
        lines += [f'  {c["verdict"]:22} {c["item"]}: {c["effect_text"]}' for c in record['gate']['changes']]
    return HardenOutcome(record, gate, '\n'.join(lines))
