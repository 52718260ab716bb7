"""The demo detector's figures in words: the training command's lines and its model card."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from metavlm_ros.demo.config import TrainingConfig
from metavlm_ros.demo.evaluation import F_TRANS_BINS, criterion_label
from metavlm_ros.method.prediction import CLASSES

__all__ = [
    'DETECTOR_OPTIONS',
    'detection_lines',
    'detector_command',
    'robustness_tables',
    'write_detector_card',
]

#: The settings that decide the demo detector, each a `metavlm train-demo-models` option of the same
#: name ('detector_steps' is --detector-steps); the card's command names those not at their default.
DETECTOR_OPTIONS = (
    'seed',
    'detector_from',
    'detector_train_frames',
    'detector_frames_per_scene',
    'detector_image_size',
    'detector_steps',
    'detector_batch_size',
    'detector_lr',
    'detector_vision_lr_scale',
    'detector_augment',
    'detector_augment_magnitude',
    'detector_min_pixels',
    'detector_calibration_frames',
    'detector_targets',
    'detector_nms_iou',
    'heldout_frames',
    'robustness_frames',
    'robustness_evaluations',
    'threads',
)


def _figure(value: float | None) -> str:
    return '-' if value is None or (isinstance(value, float) and math.isnan(value)) else f'{value:.3f}'


def detection_lines(name: str, accuracy: dict[str, Any]) -> list[str]:
    """Box accuracy (`evaluation.detection_accuracy`) as printed by the training command and the benchmark."""
    iou, right = accuracy['iou_threshold'], accuracy['frames_correct']
    return [
        f'{name} precision {_figure(accuracy["precision"])}, recall {_figure(accuracy["recall"])} '
        f'at IoU {iou:g} ({accuracy["found"]} found, {accuracy["objects"]} true objects); every object '
        f'found and nothing else on {right:.1%} of the frames',
        f'{name} per class (precision / recall): '
        + ', '.join(
            f'{c} {_figure(v["precision"])} / {_figure(v["recall"])}'
            for c, v in accuracy['per_class'].items()
        ),
        f'{name} recall of objects under {accuracy["small_pixels"]} input pixels '
        f'{_figure(accuracy["recall_small"])}, of larger ones {_figure(accuracy["recall_large"])}',
    ]


def detector_command(config: dict[str, Any]) -> str:
    """The `metavlm train-demo-models` command that trains a detector with these settings."""
    defaults = TrainingConfig()
    words = ['metavlm train-demo-models --models detector']
    for name in DETECTOR_OPTIONS:
        value = config.get(name)
        if name == 'seed' or value != getattr(defaults, name):
            words.append(f'--{name.replace("_", "-")} {value}')
    return ' '.join(words)


def robustness_tables(figures: dict[str, Any]) -> str:
    """Markdown tables of robustness figures (`evaluation.robustness`): violation rate by order, and by
    f_trans where the figures have it."""
    rows = []
    for key, table in figures['rate'].items():
        rates = {int(order): rate for order, rate in table.items()}  # JSON keys are strings
        rows.append(
            f'| {criterion_label(key)} | '
            + ' | '.join(_figure(rates.get(o)) for o in range(1, 7))
            + f' | {_figure(figures["median_smallest"][key])} |'
        )
    text = (
        '| violation rate by order | 1 | 2 | 3 | 4 | 5 | 6 | median smallest violating f_trans |\n'
        '|---|---|---|---|---|---|---|---|\n' + '\n'.join(rows)
    )
    if figures.get('rate_by_f_trans'):
        edges = [f'{e:g}' for e in F_TRANS_BINS]
        heads = [f'{low}-{high}' for low, high in zip(edges[:-1], edges[1:], strict=True)]
        rows = []
        for key, table in figures['rate_by_f_trans'].items():
            counts = figures['evaluations_by_f_trans'][key]
            cells = [f'{_figure(table[e])} ({counts[e]})' if e in table else '-' for e in edges[:-1]]
            rows.append(f'| {criterion_label(key)} | ' + ' | '.join(cells) + ' |')
        text += (
            '\n\n| violation rate (evaluations) by f_trans | '
            + ' | '.join(heads)
            + ' |\n'
            + '|---' * (len(heads) + 1)
            + '|\n'
            + '\n'.join(rows)
        )
    return text


def _targets_line(config: dict[str, Any]) -> str:
    """How the recipe taught patches their objects (a card of a run before the choice: matched)."""
    if config.get('detector_targets', 'matched') == 'dense':
        return (
            'Every patch near an object is taught it, a ring around it its box (as FCOS and YOLO are\n'
            '  taught); config.json names its class-wise non-maximum suppression at IoU '
            f'{config["detector_nms_iou"]:g}, which\n  keeps one box of each object.'
        )
    return "Each object taught to one patch near its centre, matched by DETR's cost (as OWL-ViT is taught)."


def write_detector_card(directory: Path, summary: dict[str, Any]) -> Path:
    """Write the demo detector's model card (README.md): what it is, how it was made, its figures."""
    config, result = summary['config'], summary['detector']
    accuracy = result['heldout']['accuracy']
    per_class = '\n'.join(
        f'| {c} | {_figure(v["precision"])} | {_figure(v["recall"])} |'
        for c, v in accuracy['per_class'].items()
    )
    robust = ''
    if result['heldout'].get('robustness'):
        figures = result['heldout']['robustness']
        frames = len(next(iter(figures['smallest'].values())))
        robust = (
            f'\n\n## Robustness (Rand, {config["robustness_evaluations"]} evaluations on each of {frames} '
            'held-out frames)\n\nA violation: an object of the source lost or re-classed in the follow-up, '
            'a new one, or\na box found below IoU 0.5 of where the warp moved it (docs/method.md §13).\n\n'
            + robustness_tables(figures)
        )
    scenes = math.ceil(config['detector_train_frames'] / config['detector_frames_per_scene'])
    size = config['detector_image_size']
    grid = size // config['patch_size']
    names = ', '.join(CLASSES)
    text = f"""# metavlm_ros demo-detector

**For demonstration only.** A small OwlViTForObjectDetection (an open-vocabulary detector: the
class prompts are its text queries; each of its {grid}x{grid} patches answers a box and a score per
query) that metavlm_ros ships so that `--backend detector --model demo` works on a machine with no
downloads. It has only ever seen synthetic underwater scenes drawn by `metavlm_ros.footage.scenes`;
it knows nothing about real footage and must not be used to judge real robots or real models.

- Trained by `{detector_command(config)}`
  ({config['detector_steps']} steps of {config['detector_batch_size']} frames, {config['threads']} CPU
  thread(s)) on {config['detector_train_frames']} synthetic frames from {scenes} scenes (pool, shallow and
  deep environments, {size}x{size} input, horizontal flips, brightness gain) with their ground-truth
  boxes, the classes ({names}) as text queries (docs/demo.md).
- Started from the demo CLIP {Path(result['clip_from']).name} (weights sha256
  {result['clip_weights'][:16]}...): its vision and text towers, as OWL-ViT starts from a CLIP; the
  detection heads are new.
- Augmented: {config['detector_augment']:.0%} of the training frames transformed by random compositions
  of the metamorphic relations, each parameter up to {config['detector_augment_magnitude']:.0%} of its
  maximum deviation; their boxes moved through the same warp as the oracle moves them.
- {_targets_line(config)}
- Objects under {config['detector_min_pixels']} pixels of the input are neither taught as objects nor
  as background; the figures below count every ground-truth object.
- Loads through the normal transformers classes: config.json, model.safetensors, tokenizer and
  processor files (the demo CLIP's tokenizer laid out as OWL's). Score threshold: the owlvit
  family's 0.1.
- Training: {result['seconds']:.0f} s on CPU; loss curve and settings in training.json.

## Held-out accuracy ({config['heldout_frames']} frames of fixed scenes never used for training)

Every detection against the scene generator's ground-truth boxes, class by class, a true positive
at IoU {accuracy['iou_threshold']:g} or more (the matching `metavlm search` uses on the project's footage).

| | precision | recall |
|---|---|---|
| all | {_figure(accuracy['precision'])} | {_figure(accuracy['recall'])} |
{per_class}

Every object found and nothing else on {accuracy['frames_correct']:.1%} of the frames; recall of
the objects under {accuracy['small_pixels']} pixels of the input {_figure(accuracy['recall_small'])}, of the
larger ones {_figure(accuracy['recall_large'])}.{robust}
"""
    path = Path(directory) / 'README.md'
    path.write_text(text)
    return path
