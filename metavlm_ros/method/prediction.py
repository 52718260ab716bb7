"""What a model reports about a frame (Prediction) and the one interface the search judges frames through."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from metavlm_ros.method.boxes import Detection

__all__ = ['CLASSES', 'Prediction', 'VLMBackend']

#: The paper's final labels (Table 1), in the order reports list them.
CLASSES: tuple[str, ...] = ('animal', 'vegetation', 'object', 'trash')


@dataclass(frozen=True)
class Prediction:
    """What a VLM reports about one frame.

    Attributes:
        kind: 'count' (BLIP family, Eqs. 2, 4, 7), 'confidence' (CLIP family, Eqs. 3, 5, 8) or
            'detection' (detectors and grounding VLMs: objects with boxes, docs/method.md §13);
            method/answers.py declares each.
        values: per class, a count (a float holding an int) or a confidence; for detections, how
            many objects of the class were found.
        detections: for detections, the objects found (class, score, box in the pixels of the frame
            given); empty for the other kinds.
        text: the generated answer of a generative model; '' for a contrastive one.
        error: why the answer could not be read (a parse failure: an evaluation that failed, with
            no values), '' when it was read.
        evidence: how the answer was obtained, kept with the evaluation's record (a served model: its
            request's latency_s and retries); empty for an in-process model.
    """

    kind: str
    values: dict[str, float] = field(default_factory=dict)
    text: str = ''
    detections: tuple[Detection, ...] = ()
    error: str = ''
    evidence: dict = field(default_factory=dict, compare=False)  # how, not what: not part of the answer

    def scaled(self, sx: float, sy: float) -> Prediction:
        """The same answer about a frame `sx` times as wide and `sy` times as high: its boxes moved
        to that frame's pixels (itself when it has no boxes or the frame is the same)."""
        if not self.detections or (sx == 1.0 and sy == 1.0):
            return self
        return replace(self, detections=tuple(d.scaled(sx, sy) for d in self.detections))


class VLMBackend:
    """The one interface the search talks to: batched frames in, one Prediction per frame out.

    Attributes:
        kind: 'count' or 'confidence'.
        classes: class ids every Prediction carries, in order.
        model_id: the model as the user named it (Hugging Face id, directory or 'demo').
        name: the backend's registered name (models/registry.py).
    """

    kind: str = ''
    classes: tuple[str, ...] = CLASSES
    model_id: str = ''
    name: str = ''
    #: Side in pixels of the square the model sees (its processor's output); 0 when not known here.
    input_size: int = 0

    def predict(self, frames: Sequence[np.ndarray]) -> list[Prediction]:
        """Judge frames.

        Args:
            frames: RGB uint8 arrays of shape (H, W, 3); sizes may differ.

        Returns:
            One Prediction per frame, in order.
        """
        raise NotImplementedError

    def weights_hash(self) -> str:
        """The sha256 of the weights (64 hex digits), for identity records; '' when not applicable."""
        return ''
