"""What hardening fits, per kind of answer: a model's answers on a batch against the base model's answers
on the same sources, carried through the change for boxes (docs/harden.md)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.method.encoding import Composition
from metavlm_ros.method.prediction import Prediction

__all__ = ['OBJECTIVES', 'AnswerObjective', 'ConfidenceObjective', 'DetectionObjective', 'objective_for']


def _batch(backend: Any, frames: Sequence[Any]) -> Any:
    """What the backend's trained method takes: its processor's image inputs where it has them (the
    prompt is fixed: CLIP, SigLIP, BLIP), else the frames (a chat model's processor puts each frame and
    the question together, models/backends/chat.py)."""
    image_inputs = getattr(backend, 'image_inputs', None)
    return image_inputs(frames) if callable(image_inputs) else frames


class ConfidenceObjective:
    """Confidences (contrastive and chat backends: `scores`): the mean squared difference of the per-class
    confidences from the base's, in the units the violation threshold is in."""

    def __init__(self, backend: Any, teacher: Sequence[Prediction], frames: Sequence[Any] = ()) -> None:
        import torch

        self.targets = torch.tensor(
            [[p.values[c] for c in backend.classes] for p in teacher], dtype=torch.float32
        )

    def loss(
        self, backend: Any, frames: Sequence[Any], picked: Sequence[int], changes: Sequence[Composition] = ()
    ) -> Any:
        scores = backend.scores(_batch(backend, frames))
        return ((scores - self.targets[list(picked)]) ** 2).mean()


class AnswerObjective:
    """Generated answers (BLIP and chat count backends: `answer_loss`): the cross-entropy of the base's
    answer by teacher forcing (sequence-level distillation: the follow-up must be answered in the base's
    words for the source, whose parse is the count the oracle compares). Where the backend gives the
    generated token ids (`answer_ids`, chat VLMs), those are the target, token for token; else the
    answer text, tokenised again."""

    def __init__(self, backend: Any, teacher: Sequence[Prediction], frames: Sequence[Any] = ()) -> None:
        self.answers: list = [p.text for p in teacher]
        if frames and callable(getattr(backend, 'answer_ids', None)):
            self.answers = backend.answer_ids(list(frames))

    def loss(
        self, backend: Any, frames: Sequence[Any], picked: Sequence[int], changes: Sequence[Composition] = ()
    ) -> Any:
        return backend.answer_loss(_batch(backend, frames), [self.answers[i] for i in picked])


class DetectionObjective:
    """Boxes (detector backends: `detection_outputs`): the detection loss a detector is trained with
    (training/detection_loss.py) against the base's source detections as objects, on a follow-up carried
    through the change's warp as the oracle carries them (method/boxes.py `expected_boxes`: each edge the
    middle of its band; an object the oracle does not require is neither object nor background) and with
    the object a change pastes in (§13) to be found. Every slot the matching leaves is background, so
    what the base did not find is taught as nothing, and what it found is taught to hold its place."""

    def __init__(self, backend: Any, teacher: Sequence[Prediction], frames: Sequence[Any] = ()) -> None:
        self.detections = [p.detections for p in teacher]
        self.classes = list(backend.classes)

    def objects(self, index: int, change: Composition | None, width: int, height: int) -> np.ndarray:
        """The rows (class index, cx, cy, w, h as fractions of the frame, taught) the model must answer
        with on source `index` transformed by `change` (None: the source itself)."""
        from metavlm_ros.method.boxes import expected_boxes
        from metavlm_ros.method.insertion_oracle import expected_with_insertion, inserted_in
        from metavlm_ros.method.relations import composition_matrix

        matrix = None if change is None else composition_matrix(change, width, height)
        expected = expected_boxes(self.detections[index], matrix, width, height, tolerance=0.0)
        inserted = None if change is None else inserted_in(change, width, height)
        if inserted is not None:
            expected = expected_with_insertion(expected, inserted, True, tolerance=0.0)
        rows = []
        for box in expected:
            edges = (np.asarray(box.outer) + np.asarray(box.inner)) / 2
            x1, x2 = sorted(edges[[0, 2]] / width)
            y1, y2 = sorted(edges[[1, 3]] / height)
            rows.append(
                [self.classes.index(box.cls), (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1, box.required]
            )
        return np.asarray(rows, np.float32).reshape(-1, 6)

    def loss(
        self, backend: Any, frames: Sequence[Any], picked: Sequence[int], changes: Sequence[Composition] = ()
    ) -> Any:
        from metavlm_ros.training.detection_loss import detection_loss, slot_targets

        logits, boxes = backend.detection_outputs(frames)
        steps = list(changes) or [None] * len(picked)
        objects = [
            self.objects(i, c, f.shape[1], f.shape[0]) for i, c, f in zip(picked, steps, frames, strict=True)
        ]
        if _taught_densely(backend):
            targets = _dense_targets(objects, frames, logits.shape[1], backend)
        else:
            answered = (logits.detach().sigmoid().cpu().numpy(), boxes.detach().cpu().numpy())
            targets = slot_targets(objects, *answered)
        return detection_loss(logits, boxes, *targets)[0]


def _taught_densely(backend: Any) -> bool:
    """An OWL detector that suppresses duplicates (`nms_iou`, as the demo detector names it) was taught
    every patch near an object, not one: it is hardened as it was trained (docs/harden.md)."""
    return getattr(backend, 'nms_iou', None) is not None and backend.family_name in ('owlvit', 'owlv2')


def _dense_targets(objects: list[np.ndarray], frames: Sequence[Any], slots: int, backend: Any) -> tuple:
    """`dense_box_targets` for an OWL detector's patch grid: the objects' rows (class, cx, cy, w, h,
    taught) as corners, an object the oracle does not require left untaught; OWLv2's patches tile the
    frame padded to a square at the bottom and right, so their centres are scaled to the frame's."""
    from metavlm_ros.training.detection_loss import dense_box_targets

    grid = math.isqrt(slots)
    middle = (np.stack(np.meshgrid(np.arange(grid), np.arange(grid)), axis=-1).reshape(-1, 2) + 0.5) / grid
    rows, centres = [], []
    for found, frame in zip(objects, frames, strict=True):
        height, width = frame.shape[:2]
        side = max(height, width) if backend.family.square else None
        centres.append(middle * ([side / width, side / height] if side else [1.0, 1.0]))
        corners = np.concatenate(
            [found[:, 1:3] - found[:, 3:5] / 2, found[:, 1:3] + found[:, 3:5] / 2], axis=1
        )
        area = np.where(found[:, 5] > 0, found[:, 3] * found[:, 4], -1.0)
        rows.append(np.concatenate([found[:, :1], corners, area[:, None]], axis=1).astype(np.float32))
    return dense_box_targets(rows, grid, 0.0, centres)


#: Per kind of answer, the objective and the backend method it needs.
OBJECTIVES: dict[str, tuple[type, str]] = {
    'confidence': (ConfidenceObjective, 'scores'),
    'count': (AnswerObjective, 'answer_loss'),
    'detection': (DetectionObjective, 'detection_outputs'),
}


def objective_for(backend: Any, teacher: Sequence[Prediction], frames: Sequence[Any] = ()) -> Any:
    """The objective of `backend`'s kind of answer, anchored on `teacher` (the base's answers to
    `frames`, which a generated answer's token ids are taken from again where the backend gives them).

    Raises:
        ParameterError: A backend whose answers cannot be trained on (served ones, grounding answers).
    """
    kind = getattr(backend, 'kind', '')
    entry = OBJECTIVES.get(kind)
    if entry is None or not hasattr(backend, entry[1]):
        raise ParameterError(
            f'{getattr(backend, "name", backend)}: hardening takes in-process confidence (clip, siglip, '
            'vlm), count (blip, vlm) and detector backends; see docs/harden.md'
        )
    return entry[0](backend, teacher, frames)
