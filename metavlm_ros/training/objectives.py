"""What hardening fits, per kind of answer: a model's answers on a batch against the base model's answers
on the same sources (docs/harden.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.method.prediction import Prediction

__all__ = ['OBJECTIVES', 'AnswerObjective', 'ConfidenceObjective', 'objective_for']


def _batch(backend: Any, frames: Sequence[Any]) -> Any:
    """What the backend's trained method takes: its processor's image inputs where it has them (the
    prompt is fixed: CLIP, SigLIP, BLIP), else the frames (a chat model's processor puts each frame and
    the question together, models/backends/chat.py)."""
    image_inputs = getattr(backend, 'image_inputs', None)
    return image_inputs(frames) if callable(image_inputs) else frames


class ConfidenceObjective:
    """Confidences (contrastive and chat backends: `scores`): the mean squared difference of the per-class
    confidences from the base's, in the units the violation threshold is in."""

    def __init__(self, backend: Any, teacher: Sequence[Prediction]) -> None:
        import torch

        self.targets = torch.tensor(
            [[p.values[c] for c in backend.classes] for p in teacher], dtype=torch.float32
        )

    def loss(self, backend: Any, frames: Sequence[Any], picked: Sequence[int]) -> Any:
        scores = backend.scores(_batch(backend, frames))
        return ((scores - self.targets[list(picked)]) ** 2).mean()


class AnswerObjective:
    """Generated answers (BLIP and chat count backends: `answer_loss`): the cross-entropy of the base's
    answer text by teacher forcing (sequence-level distillation: the follow-up must be answered in the
    base's words for the source, whose parse is the count the oracle compares)."""

    def __init__(self, backend: Any, teacher: Sequence[Prediction]) -> None:
        self.answers = [p.text for p in teacher]

    def loss(self, backend: Any, frames: Sequence[Any], picked: Sequence[int]) -> Any:
        return backend.answer_loss(_batch(backend, frames), [self.answers[i] for i in picked])


#: Per kind of answer, the objective and the backend method it needs.
OBJECTIVES: dict[str, tuple[type, str]] = {
    'confidence': (ConfidenceObjective, 'scores'),
    'count': (AnswerObjective, 'answer_loss'),
}


def objective_for(backend: Any, teacher: Sequence[Prediction]) -> Any:
    """The objective of `backend`'s kind of answer, anchored on `teacher` (the base's answers).

    Raises:
        ParameterError: A backend whose answers cannot be trained on (served, detections for now).
    """
    kind = getattr(backend, 'kind', '')
    entry = OBJECTIVES.get(kind)
    if entry is None or not hasattr(backend, entry[1]):
        raise ParameterError(
            f'{getattr(backend, "name", backend)}: hardening takes in-process confidence (clip, siglip, vlm) '
            'and count (blip, vlm) backends for now; see docs/harden.md'
        )
    return entry[0](backend, teacher)
