"""Fine-tune a model so its answers on follow-ups agree with its answers on the source frames, then blend
it with the base model and keep the blend that holds best on held-out frames (docs/harden.md)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from metavlm_ros.common.errors import InputError, ParameterError
from metavlm_ros.method.relations import apply_composition
from metavlm_ros.training.followups import FollowupPlan
from metavlm_ros.training.objectives import objective_for
from metavlm_ros.training.tuning import METHODS, attach, blend, choose_method
from metavlm_ros.training.validation import Figures, FrameTruth, ValidationSet

__all__ = ['CHECKPOINT', 'HardenSettings', 'Hardened', 'TrainingFrame', 'harden']

#: The training state under the model directory: a killed run continues from it (`--resume`).
CHECKPOINT = Path('training') / 'checkpoint.pt'
#: The blends of base and fine-tuned weights tried on the validation frames (WiSE-FT's alpha).
ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)


@dataclass(frozen=True)
class TrainingFrame:
    """A frame as the search sees it (working size), its sha256, its ground truth at that size (None: the
    footage has none) and its range map (None: MR12's priors)."""

    name: str
    rgb: np.ndarray
    sha256: str
    truth: FrameTruth | None = None
    #: Its range to the scene per pixel at that size, where MR12 takes the footage's ranges (None: priors).
    ranges: np.ndarray | None = None


@dataclass(frozen=True)
class HardenSettings:
    """The recipe (docs/harden.md): what is trained, for how long, how hard, and how the blend is chosen."""

    steps: int = 200
    batch: int = 8
    learning_rate: float = 0.0  # 0: by method, 1e-4 full, 1e-3 LoRA
    consistency: float = 1.0
    method: str = 'auto'
    rank: int = 8
    seed: int = 0
    threshold: float = 0.05
    iou_threshold: float = 0.5
    validation_share: float = 0.25
    validation_followups: int = 8
    max_accuracy_drop: float = 0.01
    max_drift: float = 0.1
    checkpoint_every: int = 25

    def validate(self) -> None:
        """Raises ParameterError naming the first setting out of its range."""
        checks = {
            'steps': self.steps >= 1,
            'batch': self.batch >= 1,
            'learning_rate': self.learning_rate >= 0,
            'consistency': self.consistency >= 0,
            'rank': self.rank >= 1,
            'threshold': 0 < self.threshold <= 1,
            'iou_threshold': 0 < self.iou_threshold <= 1,
            'validation_share': 0 < self.validation_share < 1,
            'validation_followups': self.validation_followups >= 1,
            'max_accuracy_drop': self.max_accuracy_drop >= 0,
            'max_drift': 0 <= self.max_drift <= 1,
            'checkpoint_every': self.checkpoint_every >= 1,
        }
        for name, ok in checks.items():
            if not ok:
                raise ParameterError(f'--{name.replace("_", "-")} out of range: {getattr(self, name)}')
        if self.method not in METHODS:
            raise ParameterError(f'--method must be one of {", ".join(METHODS)}, got {self.method!r}')

    def rate(self, method: str) -> float:
        return self.learning_rate or (1e-4 if method == 'full' else 1e-3)


@dataclass
class Hardened:
    """What a hardening run did: the method, the loss per step, the blend chosen and the validation
    figures of every blend tried, and the frames on each side of the split (by sha256)."""

    method: str
    alpha: float
    blends: dict[float, Figures]
    losses: list[float]
    train: list[str]
    validation: list[str]
    seconds: float
    resumed_at: int = 0
    trainable_parameters: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def before(self) -> Figures:
        return self.blends[0.0]

    @property
    def after(self) -> Figures:
        return self.blends[self.alpha]


def _split(frames: Sequence[TrainingFrame], share: float, rng: np.random.Generator):
    if len(frames) < 2:
        raise InputError(f'{len(frames)} frame(s): hardening needs at least 2 (training and validation)')
    order = rng.permutation(len(frames))
    n_val = min(len(frames) - 1, max(1, round(share * len(frames))))
    return [frames[i] for i in sorted(order[n_val:])], [frames[i] for i in sorted(order[:n_val])]


def _choose(blends: dict[float, Figures], settings: HardenSettings) -> tuple[float, list[str]]:
    """The blend with the lowest violation rate among those that keep the clean behaviour (accuracy
    within max_accuracy_drop of the base where there is ground truth, else clean drift within
    max_drift); ties go to the one nearer the base. The base (alpha 0) always qualifies."""
    base = blends[0.0]

    def keeps(f: Figures) -> bool:
        if base.accuracy is not None and f.accuracy is not None:
            return f.accuracy >= base.accuracy - settings.max_accuracy_drop
        return f.clean_drift <= settings.max_drift

    notes = [
        f'blend {a:g} not kept: clean behaviour moved too far' for a, f in blends.items() if not keeps(f)
    ]
    best = min((f.violation_rate, a) for a, f in blends.items() if keeps(f))[1]
    return best, notes


def _save_checkpoint(path: Path, state: dict) -> None:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix('.partial')
    torch.save(state, partial)
    os.replace(partial, path)


def _load_checkpoint(path: Path, settings: HardenSettings, plan: FollowupPlan) -> dict:
    import torch

    if not path.is_file():
        raise InputError(f'--resume: no {CHECKPOINT} under {path.parents[1]} to continue from')
    state = torch.load(path, weights_only=False)
    for what, ours in (('settings', asdict(settings)), ('plan', plan.as_record())):
        if json.dumps(state[what], sort_keys=True) != json.dumps(ours, sort_keys=True):
            raise InputError(
                f'--resume: {path} was started with other {what}; use the same ones or a new --out'
            )
    return state


def harden(
    backend: Any,
    frames: Sequence[TrainingFrame],
    plan: FollowupPlan,
    out: Path,
    settings: HardenSettings,
    *,
    resume: bool = False,
    progress: Callable[[int, int, float], None] | None = None,
) -> Hardened:
    """Fine-tune `backend`'s model in place, blend it with its base weights, and leave the chosen blend
    loaded in `backend` (the caller saves it).

    The loss, per batch of training frames: the objective of the backend's kind of answer
    (training/objectives.py: confidences' squared difference, or a generated answer's cross-entropy)
    against the base model's answers on the source frames (so its clean answers stay), plus
    `consistency` times the same on one follow-up per frame drawn from `plan` (so its answers on
    changed frames come back to those). Checkpointed under out/CHECKPOINT every `checkpoint_every`
    steps and when interrupted (KeyboardInterrupt is raised again once it is saved).

    Raises:
        ParameterError: A setting out of range, or a backend that cannot be trained.
        InputError: Too few frames, or `resume` without a checkpoint made with the same settings.
    """
    import torch

    settings.validate()
    objective_for(backend, [])  # a backend that cannot be trained is refused before any work
    started = time.monotonic()
    rng = np.random.default_rng(settings.seed)
    train, held = _split(frames, settings.validation_share, rng)
    torch.manual_seed(settings.seed)
    model = backend.model
    method = choose_method(model, settings.method)
    base_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    teacher = backend.predict([f.rgb for f in train])
    # A source the base cannot answer (a parse failure) anchors nothing: it is not trained on.
    train = [f for f, answer in zip(train, teacher, strict=True) if not answer.error]
    teacher = [answer for answer in teacher if not answer.error]
    if not train:
        raise InputError('the base model answers none of the training frames (every answer failed to parse)')
    objective = objective_for(backend, teacher, [f.rgb for f in train])
    check_rng = np.random.default_rng([settings.seed, 1])
    validation = ValidationSet(
        tuple(f.rgb for f in held),
        tuple(backend.predict([f.rgb for f in held])),
        tuple(tuple(plan.draw(check_rng) for _ in range(settings.validation_followups)) for _ in held),
        tuple(f.truth for f in held),
        tuple(f.ranges for f in held),
    )
    tuning = attach(model, method, rank=settings.rank)
    model.train()
    optimiser = torch.optim.AdamW(tuning.trainable.values(), lr=settings.rate(method), weight_decay=0.0)
    losses: list[float] = []
    start = 0
    checkpoint = out / CHECKPOINT
    if resume:
        state = _load_checkpoint(checkpoint, settings, plan)
        with torch.no_grad():
            for name, value in state['trainable'].items():
                tuning.trainable[name].copy_(value)
        optimiser.load_state_dict(state['optimiser'])
        rng.bit_generator.state = state['rng']
        torch.set_rng_state(state['torch_rng'])
        start, losses = state['step'], state['losses']

    # What a checkpoint holds is the state after the last completed step: an interrupted run continues
    # exactly as the uninterrupted one would have (same batches, same follow-ups).
    done = {'step': start, 'rng': rng.bit_generator.state, 'torch_rng': torch.get_rng_state()}

    def save() -> None:
        _save_checkpoint(
            checkpoint,
            {
                **done,
                'trainable': {k: v.detach().clone() for k, v in tuning.trainable.items()},
                'optimiser': optimiser.state_dict(),
                'losses': losses[: done['step']],
                'settings': asdict(settings),
                'plan': plan.as_record(),
            },
        )

    try:
        for step in range(start, settings.steps):
            picked = rng.integers(len(train), size=settings.batch)
            changes = [plan.draw(rng) for _ in picked]
            sources = [train[i].rgb for i in picked]
            followups = [
                apply_composition(train[i].rgb, c, ranges=train[i].ranges)
                for i, c in zip(picked, changes, strict=True)
            ]
            loss = objective.loss(backend, sources, picked)
            loss = loss + settings.consistency * objective.loss(backend, followups, picked, changes)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            done = {'step': step + 1, 'rng': rng.bit_generator.state, 'torch_rng': torch.get_rng_state()}
            losses.append(float(loss.detach()))
            if progress is not None:
                progress(step + 1, settings.steps, losses[-1])
            if (step + 1) % settings.checkpoint_every == 0 or step + 1 == settings.steps:
                save()
    except KeyboardInterrupt:
        save()
        raise
    model = tuning.finish()
    model.eval()
    tuned_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    blends = {}
    for alpha in ALPHAS:
        model.load_state_dict(blend(base_state, tuned_state, alpha))
        blends[alpha] = validation.figures(
            backend.predict, backend.classes, settings.threshold, settings.iou_threshold
        )
    alpha, notes = _choose(blends, settings)
    model.load_state_dict(blend(base_state, tuned_state, alpha))
    return Hardened(
        method=method,
        alpha=alpha,
        blends=blends,
        losses=losses,
        train=[f.sha256 for f in train],
        validation=[f.sha256 for f in held],
        seconds=time.monotonic() - started,
        resumed_at=start,
        trainable_parameters=int(sum(p.numel() for p in tuning.trainable.values())),
        notes=notes,
    )
