"""Open-vocabulary detectors in process: OWL-ViT, OWLv2, Grounding DINO and MM Grounding DINO, the class
prompts as their text queries, boxes in the given frame's pixels (docs/models.md, "Detectors")."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from metavlm_ros.common.errors import ModelError
from metavlm_ros.common.images import check_frame
from metavlm_ros.method.boxes import Detection
from metavlm_ros.method.prediction import Prediction
from metavlm_ros.models.backends.clip import CONTRASTIVE_OPTIONS, prompts_for
from metavlm_ros.models.detector_pixels import detector_pixel_path
from metavlm_ros.models.hf import HFBackend, hf_config
from metavlm_ros.models.options import Option
from metavlm_ros.models.registry import register

__all__ = [
    'DETECTOR_OPTIONS',
    'FAMILIES',
    'DetectorBackend',
    'DetectorFamily',
    'family_of',
    'frame_boxes',
    'own_nms_iou',
]


@dataclass(frozen=True)
class DetectorFamily:
    """What tells one detector family from another; everything else is one code path.

    Attributes:
        model_class: the transformers class of the family's detection model.
        threshold: the score threshold when none is given (the source is in docs/models.md).
        square: the boxes are fractions of the frame padded to a square at the bottom and right
            (OWLv2's processor pads before resizing): scaled by max(h, w), then clipped to the frame;
            otherwise fractions of the frame itself (w, h).
        phrases: the text is one caption of every class's prompt ('a. b.'), scored per token
            (Grounding DINO); otherwise one text query per class (OWL).
    """

    model_class: str
    threshold: float
    square: bool
    phrases: bool


#: config.json model_type -> family. Thresholds: OWL-ViT and OWLv2, 0.1, transformers' post-processing
#: default and its documentation's examples; Grounding DINO, 0.35, the authors' demo box threshold;
#: MM Grounding DINO, 0.3, mmdetection's demo --pred-score-thr.
FAMILIES: dict[str, DetectorFamily] = {
    'owlvit': DetectorFamily('OwlViTForObjectDetection', 0.1, square=False, phrases=False),
    'owlv2': DetectorFamily('Owlv2ForObjectDetection', 0.1, square=True, phrases=False),
    'grounding-dino': DetectorFamily('GroundingDinoForObjectDetection', 0.35, square=False, phrases=True),
    'mm-grounding-dino': DetectorFamily('MMGroundingDinoForObjectDetection', 0.3, square=False, phrases=True),
}

DETECTOR_OPTIONS: tuple[Option, ...] = (
    *CONTRASTIVE_OPTIONS,
    Option(
        'score_threshold',
        float,
        None,
        "a detection's lowest score (its best class's probability), in [0, 1]; not given: the family's "
        '(OWL-ViT, OWLv2 0.1; Grounding DINO 0.35; MM Grounding DINO 0.3)',
        low=0.0,
        high=1.0,
    ),
    Option(
        'nms_iou',
        float,
        None,
        'class-wise non-maximum suppression: of two detections of a class whose boxes overlap at more '
        "than this IoU, the lower-scoring is dropped; not given: the model's own (config.json nms_iou, "
        'as the demo detector names it), else none, as the released families are post-processed',
        low=0.0,
        high=1.0,
    ),
)


def own_nms_iou(model_dir: str | None) -> float | None:
    """The non-maximum suppression IoU a saved detector names for itself (config.json `nms_iou`), or
    None: transformers' post-processing of the released families suppresses nothing."""
    value = hf_config(model_dir).get('nms_iou')
    return None if value is None else float(value)


def family_of(model_dir: str | None) -> tuple[str, DetectorFamily]:
    """The detector family of a saved model, from its config.json model_type.

    Raises:
        ModelError: a model of no detector family.
    """
    model_type = hf_config(model_dir).get('model_type')
    if model_type not in FAMILIES:
        raise ModelError(
            f'{model_dir} is a {model_type or "unknown"} model, not an open-vocabulary detector '
            f'(config model_type {", ".join(FAMILIES)})'
        )
    return model_type, FAMILIES[model_type]


def frame_boxes(centres: Any, sizes: Sequence[tuple[int, int]], square: bool) -> Any:
    """Boxes (x1, y1, x2, y2) in each frame's pixels from the model's (cx, cy, w, h) fractions.

    Args:
        centres: (frames, queries, 4) tensor of box centres and sizes, fractions of the model's view.
        sizes: each frame's (height, width).
        square: the view is the frame padded to a square at the bottom and right (OWLv2): fractions of
            max(h, w) on both axes; else fractions of the frame's width and height.

    Returns:
        (frames, queries, 4) float tensor, clipped to each frame (a box in the padding has no area).
    """
    import torch
    from transformers.image_transforms import center_to_corners_format

    corners = center_to_corners_format(centres.float())
    hw = torch.tensor(sizes, dtype=torch.float32, device=corners.device)
    height, width = hw[:, 0], hw[:, 1]
    scale_x = torch.maximum(height, width) if square else width
    scale_y = torch.maximum(height, width) if square else height
    scale = torch.stack([scale_x, scale_y, scale_x, scale_y], dim=1)[:, None, :]
    limit = torch.stack([width, height, width, height], dim=1)[:, None, :]
    return torch.minimum((corners * scale).clamp(min=0), limit)


@register
class DetectorBackend(HFBackend):
    """An open-vocabulary detector: the class prompts are its text queries, each query slot whose best
    class scores above the threshold is a detection of that class (docs/method.md §13). The family
    (OWL-ViT, OWLv2, Grounding DINO, MM Grounding DINO) is read from config.json's model_type."""

    name = 'detector'
    kinds = ('detection',)
    options = DETECTOR_OPTIONS

    def __init__(
        self,
        model: str,
        *,
        prompts: str,
        class_prompts: Mapping[str, str] | Sequence[str] | None,
        score_threshold: float | None,
        nms_iou: float | None,
        classes: Sequence[str],
        **common: Any,
    ) -> None:
        self.class_prompts = prompts_for(classes, prompts, class_prompts)
        super().__init__(model, classes=classes, **common)  # reads the family (_model_class)
        self.score_threshold = self.family.threshold if score_threshold is None else float(score_threshold)
        self.nms_iou = own_nms_iou(self.model_path) if nms_iou is None else float(nms_iou)

    @classmethod
    def check(cls, options: Mapping[str, Any]) -> None:
        prompts_for(options['classes'], options['prompts'], options['class_prompts'])

    @classmethod
    def describe(cls, model_dir: str | None, options: Any) -> dict[str, Any]:
        described = super().describe(model_dir, options)
        model_type = hf_config(model_dir).get('model_type')
        family = FAMILIES.get(model_type)
        threshold = options.get('score_threshold')
        if threshold is None and family is not None:
            threshold = family.threshold
        nms = options.get('nms_iou')
        if nms is None:
            nms = own_nms_iou(model_dir)
        return {**described, 'family': model_type, 'score_threshold': threshold, 'nms_iou': nms}

    def _processor_class(self, transformers: Any) -> Any:
        return transformers.AutoProcessor

    def _model_class(self, transformers: Any) -> Any:
        self.family_name, self.family = family_of(self.model_path)
        return getattr(transformers, self.family.model_class)

    def _prepare(self) -> None:
        prompts = [self.class_prompts[c] for c in self.classes]
        tokenizer = self.processor.tokenizer
        if self.family.phrases:
            # One caption, each prompt a phrase ended by '.', as Grounding DINO was trained; a class
            # owns the tokens inside its phrase (offsets), and its score is their best.
            phrases = [p.strip().rstrip('.') for p in prompts]
            caption = ''.join(f'{p}. ' for p in phrases).strip()
            text = tokenizer(caption, return_offsets_mapping=True, truncation=True, return_tensors='pt')
            offsets = text.pop('offset_mapping')[0].tolist()
            owner = np.zeros((len(phrases), len(offsets)), dtype=bool)
            start = 0
            for index, phrase in enumerate(phrases):
                end = start + len(phrase)
                owner[index] = [a >= start and b <= end and b > a for a, b in offsets]
                start = end + 2
            if not owner.any(axis=1).all():
                missing = [c for c, row in zip(self.classes, owner, strict=True) if not row.any()]
                raise ModelError(
                    f'the caption is cut before the prompts of {", ".join(missing)}: shorten them'
                )
        else:
            # One query per class, padded to the text tower's length (OWL reads 16 tokens).
            length = int(self.model.config.text_config.max_position_embeddings)
            text = tokenizer(
                prompts, padding='max_length', max_length=length, truncation=True, return_tensors='pt'
            )
            owner = np.eye(len(prompts), dtype=bool)
        self._text = {k: v.to(self.device) for k, v in text.items()}
        self._owner = owner
        self._pixel_inputs = detector_pixel_path(self.processor)

    def predict(self, frames: Sequence[np.ndarray]) -> list[Prediction]:
        """Find the classes' objects in frames, in batches of `batch_size`; boxes in each frame's pixels."""
        import torch

        frames = [check_frame(frame, what=f'frame {index}') for index, frame in enumerate(frames)]
        predictions: list[Prediction] = []
        with torch.inference_mode():
            for start in range(0, len(frames), self.batch_size):
                batch = frames[start : start + self.batch_size]
                sizes = [(int(f.shape[0]), int(f.shape[1])) for f in batch]
                predictions.extend(self._detect(self.image_inputs(batch), sizes))
        return predictions

    def _class_logits(self, images: dict[str, Any], count: int) -> tuple[Any, Any]:
        """Every query slot's logit per class, (frames, slots, classes), and its box as the model gives
        it, (frames, slots, 4) centre-size fractions of the model's view; differentiable outside
        inference mode."""
        import torch

        # _text was made under inference_mode: outside it, only a plain copy can take part in autograd.
        own = self._text
        if not torch.is_inference_mode_enabled():
            own = {k: v.clone() for k, v in own.items()}
        if self.family.phrases:
            text = {k: v.expand(count, -1) for k, v in own.items()}
        else:
            # OWL takes (frames x queries) texts, frame by frame.
            text = {k: v.repeat(count, 1) for k, v in own.items()}
        outputs = self.model(**text, **images)
        logits = outputs.logits.float()  # (frames, slots, queries or tokens)
        owner = torch.as_tensor(self._owner, device=logits.device)
        logits = logits[..., : owner.shape[1]]
        # Per class, the best of its tokens (one query per class for OWL), compared as logits: the
        # sigmoid saturates to 1.0 in float32, where ties would pick classes by their order.
        per_class = torch.stack([logits[..., row].amax(dim=-1) for row in owner], dim=-1)
        return per_class, outputs.pred_boxes

    def _slots(self, images: dict[str, Any], sizes: list[tuple[int, int]]) -> tuple[Any, Any, Any]:
        """Every query slot's score, best class and box in its frame's pixels: (frames, slots) tensors and
        (frames, slots, 4) boxes, the scores differentiable outside inference mode."""
        per_class, centres = self._class_logits(images, len(sizes))
        best, labels = per_class.max(dim=-1)  # (frames, slots)
        return best.sigmoid(), labels, frame_boxes(centres, sizes, self.family.square)

    def detection_outputs(self, frames: Sequence[np.ndarray]) -> tuple[Any, Any]:
        """What the model answers frames with, as a detector is trained on it (hardening, docs/harden.md):
        every slot's logit per class, (frames, slots, classes), and its box as (cx, cy, w, h) fractions of
        its frame, (frames, slots, 4); both differentiable in the weights. OWLv2's boxes, fractions of the
        frame padded to a square, are rescaled to the frame's own."""
        import torch

        per_class, centres = self._class_logits(self.image_inputs(list(frames)), len(frames))
        if self.family.square:
            scale = []
            for frame in frames:
                height, width = frame.shape[:2]
                side = max(height, width)
                scale.append([side / width, side / height, side / width, side / height])
            centres = centres * torch.tensor(scale, device=centres.device)[:, None, :]
        return per_class, centres.float()

    def _detect(self, images: dict[str, Any], sizes: list[tuple[int, int]]) -> list[Prediction]:
        scores, labels, boxes = self._slots(images, sizes)
        kept = self._kept(scores, labels, boxes)
        return [
            self._prediction(*(t[i][kept[i]].cpu().numpy() for t in (scores, labels, boxes)))
            for i in range(len(sizes))
        ]

    def _kept(self, scores: Any, labels: Any, boxes: Any) -> Any:
        """Which slots are detections, (frames, slots) booleans: a score above the threshold (the float32
        score compared in float64), a box with area in the frame, and, with `nms_iou`, not suppressed
        by a higher-scoring box of its class (torchvision's batched_nms)."""
        import torch

        with torch.no_grad():
            kept = (scores.double() > self.score_threshold) & (boxes[..., 2] > boxes[..., 0])
            kept &= boxes[..., 3] > boxes[..., 1]
            if self.nms_iou is not None:
                from torchvision.ops import batched_nms

                for row in range(len(kept)):
                    index = kept[row].nonzero().flatten()
                    survivors = batched_nms(
                        boxes[row, index].float(),
                        scores[row, index].float(),
                        labels[row, index],
                        self.nms_iou,
                    )
                    kept[row] = False
                    kept[row, index[survivors]] = True
        return kept

    @property
    def pixel_scores(self) -> Callable[[Any], Any] | None:
        """Per class, the sum of its detections' scores (what occlusion reads from `predict`) as a function
        of frames' pixels that torch differentiates, or None where the family's image processor has no
        differentiable path here (models/detector_pixels.py: the torchvision processors).

        The function takes frames as a float tensor (N, 3, H, W) of 0..255 values, all of one size, and
        gives (N, classes): the sigmoid scores of the slots whose best class it is, kept as `predict`
        keeps detections (above score_threshold, with area in the frame). Which slots are kept is
        decided without gradient; their scores keep theirs, so a slot crossing the threshold moves the
        number by its whole score (integrated gradients' completeness gap shows such steps).
        """
        return self._pixel_scores if self._pixel_inputs is not None else None

    def _pixel_scores(self, pixels: Any) -> Any:
        import torch

        sizes = [(int(pixels.shape[-2]), int(pixels.shape[-1]))] * len(pixels)
        images = self._pixel_inputs(pixels.to(self.device), self.dtype)
        scores, labels, boxes = self._slots(images, sizes)
        kept = self._kept(scores, labels, boxes)  # as `predict` keeps detections
        with torch.no_grad():
            classes = torch.nn.functional.one_hot(labels, len(self.classes)) * kept[..., None]
        return (scores[..., None] * classes.to(scores.dtype)).sum(dim=1)

    def _prediction(self, scores: np.ndarray, labels: np.ndarray, boxes: np.ndarray) -> Prediction:
        """A frame's detections from its kept slots (`_kept`; a box wholly in OWLv2's padding is clipped
        to nothing and is not an object of the frame), best first."""
        found = [
            Detection(self.classes[int(label)], float(score), tuple(float(v) for v in box))
            for score, label, box in zip(scores, labels, boxes, strict=True)
        ]
        found.sort(key=lambda d: -d.score)
        values = {c: float(sum(d.cls == c for d in found)) for c in self.classes}
        return Prediction('detection', values, detections=tuple(found))

    @classmethod
    def build_tiny(cls, directory: Path, *, family: str = 'owlv2', **variant: Any) -> None:
        """A tiny random-weight detector of a family (models/tiny_detectors.py DETECTOR_FAMILIES)."""
        from metavlm_ros.models.tiny_detectors import build_tiny_detector

        build_tiny_detector(directory, family=family, seed=None)  # build_tiny_model seeded it
