"""The whole recipe: train, evaluate and describe the embedded demo CLIP, BLIP and detector."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from metavlm_ros.demo.config import BLIP_EXACT_TARGET, BLIP_PRESENCE_TARGET, CLIP_AUC_TARGET, TrainingConfig
from metavlm_ros.demo.detector_card import detection_lines, write_detector_card
from metavlm_ros.demo.evaluation import (
    answer_examples,
    auc_by_environment,
    blip_answers,
    clip_scores,
    count_metrics,
    detection_accuracy,
    presence_auc,
    robustness,
    robustness_frames,
    robustness_lines,
)
from metavlm_ros.demo.scenes import datasets, detector_datasets
from metavlm_ros.demo.train_blip import train_blip
from metavlm_ros.demo.train_clip import train_clip
from metavlm_ros.demo.train_detector import train_detector
from metavlm_ros.method.prediction import CLASSES

__all__ = [
    'train_demo_models',
    'write_model_card',
]


def _per_class(values: dict[str, float]) -> str:
    return ', '.join(f'{c} {v:.3f}' for c, v in values.items())


def _recorded_path(path: Path) -> str:
    """A model directory as a training record names it: package-relative for the models this package
    ships (metavlm_ros/models/...), so the record holds no path of the machine it was trained on; any
    other directory as given."""
    package = Path(__file__).resolve().parents[1]
    try:
        return str(Path(package.name) / Path(path).resolve().relative_to(package))
    except ValueError:
        return str(path)


def _curve_text(curve: Sequence[float]) -> str:
    return ' '.join(f'{v:.3f}' for v in curve)


def train_demo_models(
    out: Path,
    config: TrainingConfig,
    *,
    cache: Path | None = None,
    log: Callable[[str], None] = print,
    models: Sequence[str] = ('clip', 'blip'),
    vision_from: Path | None = None,
) -> dict[str, Any]:
    """Render the data, train the demo models, evaluate each on the held-out set.

    Args:
        out: the models go to out/demo-clip, out/demo-blip and out/demo-detector (created or replaced).
        config: the recipe.
        cache: a directory to keep rendered scenes in between runs (same config, same arrays).
        log: where progress lines go.
        models: which of 'clip', 'blip' and 'detector' to train, in this order.
        vision_from: a trained demo CLIP to start the BLIP vision tower from. None: the CLIP trained
            in this run when there is one (the default recipe trains both, CLIP first), else random
            initialisation. The detector's CLIP is `config.detector_from` (None: the CLIP trained in
            this run, else the shipped one).

    Returns:
        A summary: config, seconds, loss curves and held-out metrics per model.
    """
    import torch

    from metavlm_ros.models.vlm import create_backend

    config.validate()
    torch.set_num_threads(config.threads)
    started = time.monotonic()
    summary: dict[str, Any] = {'config': asdict(config)}
    if set(models) - {'detector'}:
        train, heldout = datasets(config, cache=cache, log=log)
        presence = (train.counts > 0).mean(axis=0)
        log(
            'class presence in training frames: '
            + ', '.join(f'{c} {p:.2f}' for c, p in zip(CLASSES, presence, strict=True))
        )
        log(f'data ready in {time.monotonic() - started:.0f} s')
    for name in models:
        directory = Path(out) / f'demo-{name}'
        t0 = time.monotonic()
        if name == 'detector':
            summary[name] = _detector(directory, config, cache, log, clip_trained='clip' in summary)
            continue
        if name == 'clip':
            curve = train_clip(train, config, directory, log)
        else:
            start = vision_from
            if start is None and 'clip' in summary and not config.init_from:
                start = Path(out) / 'demo-clip'
            curve = train_blip(train, config, directory, log, vision_from=start)
        seconds = time.monotonic() - t0
        backend = create_backend(name, str(directory), device='cpu')
        # With a labelling rule, the same answers are also judged against the generator's truth.
        with_rule = config.min_input_pixels > 0 and heldout.generator_counts is not None
        if name == 'clip':
            scores = clip_scores(backend, heldout)
            metrics: dict[str, Any] = {'auc': presence_auc(scores, heldout.counts)}
            if with_rule:
                metrics['generator_rule'] = {'auc': presence_auc(scores, heldout.generator_counts)}
            for label, values in (('', metrics), (' (generator rule)', metrics.get('generator_rule'))):
                if values:
                    log(f'clip held-out ROC AUC{label}: ' + _per_class(values['auc']))
            if heldout.environments is not None:
                metrics['auc_by_environment'] = auc_by_environment(scores, heldout)
                for environment, values in metrics['auc_by_environment'].items():
                    log(f'clip held-out ROC AUC within {environment} frames: ' + _per_class(values))
        else:
            texts = blip_answers(backend, heldout)
            metrics = count_metrics(texts, heldout.counts)
            if with_rule:
                metrics['generator_rule'] = count_metrics(texts, heldout.generator_counts)
            log(f'blip held-out parsed {metrics["parsed"]:.3f}')
            for label, values in (('', metrics), (' (generator rule)', metrics.get('generator_rule'))):
                if values:
                    log(f'blip held-out exact count{label}: ' + _per_class(values['exact']))
                    log(f'blip held-out presence{label}: ' + _per_class(values['presence']))
            metrics['examples'] = answer_examples(texts, heldout)
            for answer, truth in metrics['examples']:
                log(f'  answer {answer!r}  truth {truth!r}')
        if config.robustness_evaluations:
            frames = robustness_frames(heldout, config.robustness_frames)
            t1 = time.monotonic()
            metrics['robustness'] = robustness(backend, frames, evaluations=config.robustness_evaluations)
            for line in robustness_lines(
                name, metrics['robustness'], len(frames), config.robustness_evaluations
            ):
                log(line)
            log(f'{name} robustness measured in {time.monotonic() - t1:.0f} s')
        log(f'{name} loss curve (every {config.log_every} steps): {_curve_text(curve)}')
        summary[name] = {'seconds': round(seconds, 1), 'loss_curve': curve, 'heldout': metrics}
        if name == 'blip':
            summary[name]['vision_from'] = (
                str(vision_from) if vision_from is not None else 'demo-clip of this run' if start else None
            )
        (directory / 'training.json').write_text(
            json.dumps(summary[name] | {'config': asdict(config)}, indent=1)
        )
    summary['seconds'] = round(time.monotonic() - started, 1)
    return summary


def _detector(
    directory: Path,
    config: TrainingConfig,
    cache: Path | None,
    log: Callable[[str], None],
    *,
    clip_trained: bool,
) -> dict[str, Any]:
    """Train the demo detector into `directory` from its CLIP, judge it on the held-out set's true boxes
    and by Rand; write its training.json and return its summary."""
    from metavlm_ros.models.model_files import resolve_model, weights_hash
    from metavlm_ros.models.vlm import create_backend

    t0 = time.monotonic()
    train, heldout = detector_datasets(config, cache=cache, log=log)
    log(f'detector data ready in {time.monotonic() - t0:.0f} s')
    if config.detector_from:
        clip = Path(config.detector_from)
    else:
        clip = directory.parent / 'demo-clip' if clip_trained else Path(resolve_model('clip', 'demo'))
    t0 = time.monotonic()
    trained = train_detector(train, config, directory, log, clip_dir=clip)
    curve = trained['loss_curve']
    seconds = time.monotonic() - t0
    backend = create_backend('detector', str(directory), device='cpu')
    metrics: dict[str, Any] = {'accuracy': detection_accuracy(backend, heldout)}
    for line in detection_lines('detector held-out', metrics['accuracy']):
        log(line)
    if config.robustness_evaluations:
        frames = robustness_frames(heldout, config.robustness_frames)
        t1 = time.monotonic()
        metrics['robustness'] = robustness(backend, frames, evaluations=config.robustness_evaluations)
        for line in robustness_lines(
            'detector', metrics['robustness'], len(frames), config.robustness_evaluations
        ):
            log(line)
        log(f'detector robustness measured in {time.monotonic() - t1:.0f} s')
    log(f'detector loss curve (every {config.log_every} steps): {_curve_text(curve)}')
    result = {
        'seconds': round(seconds, 1),
        'loss_curve': curve,
        'heldout': metrics,
        'clip_from': _recorded_path(clip),
        'clip_weights': weights_hash(clip, length=64),
        'calibration': trained['calibration'],
    }
    (directory / 'training.json').write_text(json.dumps(result | {'config': asdict(config)}, indent=1))
    return result


def write_model_card(directory: Path, name: str, summary: dict[str, Any]) -> Path:
    """Write the model card (README.md) of a trained demo model: what it is, its data, its held-out scores."""
    if name == 'detector':
        return write_detector_card(directory, summary)
    config = summary['config']
    result = summary[name]
    steps = config['clip_steps'] if name == 'clip' else config['blip_steps']
    held = result['heldout']
    if name == 'clip':
        kind = 'CLIPModel (zero-shot class presence: cosine of image and class-prompt embeddings)'
        generator = held.get('generator_rule', {}).get('auc', {})
        scores = '\n'.join(
            f'| {c} | ROC AUC {v:.3f} |' + (f' {generator[c]:.3f} |' if c in generator else '')
            for c, v in held['auc'].items()
        )
        met = all(v >= CLIP_AUC_TARGET for v in held['auc'].values())
        target = f'ROC AUC >= {CLIP_AUC_TARGET:.2f} for every class'
    else:
        kind = 'BlipForConditionalGeneration (answers the Table 1 prompt in the Table 1 format)'
        generator = held.get('generator_rule', {})

        def cell(values: dict[str, Any], c: str) -> str:
            return f'exact count {values["exact"][c]:.3f}, presence {values["presence"][c]:.3f}'

        scores = f'| parsed | {held["parsed"]:.3f} |' + (' |' if generator else '') + '\n'
        scores += '\n'.join(
            f'| {c} | {cell(held, c)} |' + (f' {cell(generator, c)} |' if generator else '') for c in CLASSES
        )
        met = (
            held['parsed'] == 1.0
            and all(held['exact'][c] >= BLIP_EXACT_TARGET for c in CLASSES)
            and all(held['presence'][c] >= BLIP_PRESENCE_TARGET for c in CLASSES)
        )
        target = (
            f'every answer parsed, exact count >= {BLIP_EXACT_TARGET:.2f} and presence >= '
            f'{BLIP_PRESENCE_TARGET:.2f} for every class'
        )
    start = ''
    if config.get('init_from'):
        start = (
            f'\n- Fine-tuned from the demo-{name} in {config["init_from"]} (its weights and tokenizer); '
            'docs/demo.md gives the command and where that model came from.'
        )
        if name == 'clip' and config.get('clip_distill_weight'):
            start += (
                f'\n- Distilled from that CLIP (weight {config["clip_distill_weight"]:g}): its cosines on '
                'each untransformed frame, mapped into the band, are the targets on the frame and its '
                'transformed copies.'
            )
        if name == 'blip' and config.get('blip_teacher_answers'):
            start += (
                "\n- Taught that BLIP's own answers on the untransformed training frames instead of the "
                'ground-truth captions, on the frames and their transformed copies.'
            )
            if config.get('blip_teacher_votes'):
                start += (
                    f' Each target is the answer it gave most often over the frame and '
                    f'{config["blip_teacher_votes"]} transformed copies of it.'
                )
    elif result.get('vision_from') == 'demo-clip of this run':
        start = '\n- Vision tower started from the demo CLIP trained in the same run.'
    elif result.get('vision_from'):
        start = f'\n- Vision tower started from the demo CLIP in {result["vision_from"]}.'
    header = '| | labelling rule | generator rule |\n|---|---|---|' if generator else '| | |\n|---|---|'
    rule = config.get('min_input_pixels', 0)
    labels = "Labels are the scene generator's ground truth."
    if rule:
        labels = (
            f'Labels follow a labelling rule: an object counts when its visible part covers at least {rule}\n'
            f'pixels of the {config["image_size"]}x{config["image_size"]} input (training captions and '
            'held-out truth alike). The generator rule\ncolumn judges the same answers against the scene '
            "generator's own ground truth."
        )
    scenes = math.ceil(config['train_frames'] / config.get('frames_per_scene', 1))
    size = config['image_size']
    within = ''
    if held.get('auc_by_environment'):
        # The environments differ in how often each class shows, which the all-frames AUC also rewards.
        rows = [
            f'| {e} | ' + ' | '.join(f'{v[c]:.3f}' for c in CLASSES) + ' |'
            for e, v in held['auc_by_environment'].items()
        ]
        table = '\n'.join(
            ['| within | ' + ' | '.join(CLASSES) + ' |', '|---' * (len(CLASSES) + 1) + '|', *rows]
        )
        within = f'\n\nROC AUC within the frames of each environment:\n\n{table}'
    augment = ''
    if config.get('augment'):
        augment = (
            f'\n- Augmented: {config["augment"]:.0%} of the training frames transformed by random '
            f'compositions of the metamorphic relations, each parameter up to '
            f'{config["augment_magnitude"]:.0%} of its '
            'maximum deviation (black borders included).'
        )
        if name == 'blip' and config.get('blip_consistency_weight'):
            augment += (
                f'\n- Consistency: {config["blip_consistency_pairs"]:.0%} of each batch repeats frames of '
                "the batch, transformed; the symmetric KL divergence of the two copies' next-token "
                f'distributions over the answer, weight {config["blip_consistency_weight"]:g}, keeps '
                'the answer from moving.'
            )
        if name == 'clip':
            augment += (
                f'\n- Cosines calibrated to {config["clip_cosine_centre"]} +- {config["clip_cosine_band"]} '
                f'(presence logits {config["clip_presence_scale"]:g} * (cosine - centre) + class bias).'
            )
    robust = ''
    if held.get('robustness'):
        figures = held['robustness']
        rows = []
        for key, table in figures['rate'].items():
            rates = {int(order): rate for order, rate in table.items()}  # JSON keys are strings
            label = 'count change' if key == 'count' else f'Th {key}'
            median = figures['median_smallest'][key]
            rows.append(
                f'| {label} | '
                + ' | '.join(f'{rates[o]:.3f}' if o in rates else '-' for o in range(1, 7))
                + f' | {"none" if median is None else f"{median:.3f}"} |'
            )
        frames = len(next(iter(figures['smallest'].values())))
        evaluations = config.get('robustness_evaluations')
        robust = (
            f'\n\n## Robustness (Rand, {evaluations} evaluations on each of {frames} held-out frames)\n\n'
            '| violation rate by order | 1 | 2 | 3 | 4 | 5 | 6 | median smallest violating f_trans |\n'
            '|---|---|---|---|---|---|---|---|\n' + '\n'.join(rows)
        )
    text = f"""# metavlm_ros demo-{name}

**For demonstration only.** A small {kind} that metavlm_ros ships so that `metavlm demo` and
`model: demo` work on a machine with no downloads. It has only ever seen synthetic underwater
scenes drawn by `metavlm_ros.footage.scenes`; it knows nothing about real footage and must not be
used to judge real robots or real models.

- Trained by `metavlm train-demo-models --seed {config['seed']}` ({steps} steps of
  {config['batch_size']} frames, {config['threads']} CPU thread(s)) on {config['train_frames']} synthetic
  frames from {scenes} scenes (pool, shallow and deep environments, {size}x{size} input, horizontal
  flips), with captions in the Table 1 format and per-patch object-centre and
  class-coverage maps from the ground truth (docs/demo.md).{start}{augment}
- Loads through the normal transformers classes: config.json, model.safetensors, tokenizer and
  processor files (own tokenizer trained with the `tokenizers` library).
- Training: {result['seconds']:.0f} s on CPU; loss curve and settings in training.json.

## Held-out scores ({config['heldout_frames']} frames of fixed scenes never used for training)

{labels}

{header}
{scores}{within}

Target of the project: {target}: **{'met' if met else 'not met'}**.{robust}
"""
    path = Path(directory) / 'README.md'
    path.write_text(text)
    return path
