"""Training of the demo detector: an OWL-ViT started from the demo CLIP, taught the scenes' true boxes."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from metavlm_ros.demo.batches import lr_schedule
from metavlm_ros.demo.config import CLASS_PHRASES, CLIP_TEMPLATES, TrainingConfig
from metavlm_ros.demo.detector_targets import box_targets, dense_box_targets, detection_batch, detection_loss
from metavlm_ros.demo.scenes import SceneSet
from metavlm_ros.method.prediction import CLASSES

__all__ = [
    'CALIBRATION_F1_SLACK',
    'CALIBRATION_SHIFTS',
    'OWL_TEXT_LENGTH',
    'calibrate',
    'detector_outputs',
    'owl_from_clip',
    'owl_tokenizer_from',
    'train_detector',
]

#: OWL's text tower reads 16 tokens, as the released configs; the default prompts take 11 of the CLIP's.
OWL_TEXT_LENGTH = 16
#: OpenAI CLIP's pixel mean and standard deviation, which the demo models' processors normalise with.
PIXEL_MEAN, PIXEL_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
#: The detection heads' starting point: logit scale, and the probability of an object at every patch.
INITIAL_LOGIT_SCALE, PRIOR = 10.0, 0.01
#: The chance that a training step asks with the backend's default prompts rather than other phrasings.
DEFAULT_PROMPT_SHARE = 0.5
#: The changes of the class head's logit shift `calibrate` tries (in its units: a logit moves by the
#: shift times the patch's logit scale, about 10): from far fewer detections to a few more.
CALIBRATION_SHIFTS = tuple(round(v, 3) for v in np.arange(-0.4, 0.075, 0.05))
#: Shifts whose F1 is within this of the best count as equal, and the most precise of them is kept: a
#: detector's false detections score low and are the ones a small change moves across the threshold
#: (docs/demo.md, "The demo detector", its known gap), so of two equally good operating points the one with
#: fewer is the steadier.
CALIBRATION_F1_SLACK = 0.01


def owl_tokenizer_from(tokenizer: Any) -> tuple[Any, np.ndarray]:
    """A CLIP tokenizer laid out as OWL-ViT's: start and end of text take the two last ids, padding is
    '!'. OWL takes a query whose first id is 0 for padding and pools each query at its largest id,
    which must be the end of text, as in the released vocabulary.

    Returns:
        The tokenizer, and `order`: the old id of each new id (token embedding rows move with it).
    """
    from transformers import CLIPTokenizer

    vocab = tokenizer.get_vocab()
    specials = [tokenizer.bos_token, tokenizer.eos_token]
    tokens = sorted((t for t in vocab if t not in specials), key=vocab.__getitem__) + specials
    merges = json.loads(tokenizer.backend_tokenizer.to_str())['model']['merges']
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(' ')) for m in merges]
    owl = CLIPTokenizer(
        vocab={t: i for i, t in enumerate(tokens)},
        merges=merges,
        model_max_length=OWL_TEXT_LENGTH,
        pad_token='!',
    )
    return owl, np.asarray([vocab[t] for t in tokens])


def owl_from_clip(clip_dir: Path, seed: int, image_size: int | None = None) -> tuple[Any, Any]:
    """An OWL-ViT detector whose towers are a trained CLIP's (as OWL-ViT was made from CLIP): the same
    vision tower, the text tower with its tokenizer laid out as OWL's and its first 16 positions;
    the detection heads new (seeded). With an `image_size` other than the CLIP's, the vision tower's
    position embeddings are resized to the new patch grid (bicubic), as OWL-ViT resizes CLIP's.

    Returns:
        (model, tokenizer).
    """
    import torch
    from transformers import CLIPModel, CLIPProcessor, OwlViTConfig, OwlViTForObjectDetection

    clip = CLIPModel.from_pretrained(clip_dir, local_files_only=True, use_safetensors=True)
    tokenizer, order = owl_tokenizer_from(
        CLIPProcessor.from_pretrained(clip_dir, local_files_only=True).tokenizer
    )
    shape = ('hidden_size', 'intermediate_size', 'num_hidden_layers', 'num_attention_heads', 'hidden_act')
    text = {k: getattr(clip.config.text_config, k) for k in shape} | {
        'vocab_size': len(tokenizer),
        'max_position_embeddings': OWL_TEXT_LENGTH,
        'bos_token_id': tokenizer.bos_token_id,
        'eos_token_id': tokenizer.eos_token_id,
        'pad_token_id': tokenizer.pad_token_id,
    }
    vision = {k: getattr(clip.config.vision_config, k) for k in (*shape, 'image_size', 'patch_size')}
    vision['image_size'] = image_size or vision['image_size']
    config = OwlViTConfig(text_config=text, vision_config=vision, projection_dim=clip.config.projection_dim)
    torch.manual_seed(seed)
    model = OwlViTForObjectDetection(config)
    weights = {
        f'owlvit.{k.replace("pre_layrnorm", "pre_layernorm")}': v for k, v in clip.state_dict().items()
    }
    tokens = 'owlvit.text_model.embeddings.token_embedding.weight'
    positions = 'owlvit.text_model.embeddings.position_embedding.weight'
    weights[tokens] = weights[tokens][torch.from_numpy(order)]
    weights[positions] = weights[positions][:OWL_TEXT_LENGTH]
    grid = vision['image_size'] // vision['patch_size']
    patches = 'owlvit.vision_model.embeddings.position_embedding.weight'
    if len(weights[patches]) != grid * grid + 1:
        weights[patches] = _resized_positions(weights[patches], grid)
    weights.pop('owlvit.text_model.embeddings.position_ids', None)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if unexpected or any(k.startswith('owlvit.') for k in missing):
        raise RuntimeError(f'the CLIP does not fit the OWL-ViT towers: {unexpected or missing}')
    with torch.no_grad():
        # transformers initialises OWL's head layers with unit-variance weights (its factor for the
        # released model's last layers): activations in the hundreds here. PyTorch's own initialisation
        # instead, and a zero last box layer, so that every patch starts by answering its own patch's box.
        for layer in (model.box_head.dense0, model.box_head.dense1, model.class_head.dense0):
            layer.reset_parameters()
        model.box_head.dense2.weight.zero_()
        model.box_head.dense2.bias.zero_()
        # Logits (cosine + shift) * scale start at scale INITIAL_LOGIT_SCALE and at a prior (as RetinaNet
        # starts: every patch about 1 % likely an object), not wherever random heads put them.
        head = model.class_head
        for layer in (head.logit_shift, head.logit_scale):
            layer.weight.zero_()
        head.logit_scale.bias.fill_(INITIAL_LOGIT_SCALE - 1)  # ELU(x) + 1 = x + 1 for x > 0
        head.logit_shift.bias.fill_(math.log(PRIOR / (1 - PRIOR)) / INITIAL_LOGIT_SCALE)
    return model, tokenizer


def _resized_positions(table: Any, grid: int) -> Any:
    """A ViT's position embeddings (class, then a square grid row by row) resized to a grid x grid one."""
    import torch
    from torch.nn import functional

    side = math.isqrt(len(table) - 1)
    square = table[1:].reshape(1, side, side, -1).permute(0, 3, 1, 2)
    resized = functional.interpolate(square, size=(grid, grid), mode='bicubic', align_corners=False)
    return torch.cat([table[:1], resized.permute(0, 2, 3, 1).reshape(grid * grid, -1)])


def _pixels(small: np.ndarray, gain: np.ndarray) -> Any:
    """Inputs as the processor makes them (rescaled, normalised with OpenAI CLIP's mean and std), each
    frame's brightness scaled by its gain first (then clipped): batches.normalised_pixels in torch."""
    import torch

    x = torch.from_numpy(small).permute(0, 3, 1, 2).float() / 255.0
    x = (x * torch.from_numpy(gain).float()[:, None, None, None]).clamp(0.0, 1.0)
    mean = torch.tensor(PIXEL_MEAN)[None, :, None, None]
    return (x - mean) / torch.tensor(PIXEL_STD)[None, :, None, None]


def detector_outputs(model: Any, text: dict[str, Any], pixels: Any) -> tuple[Any, Any]:
    """OwlViTForObjectDetection's forward, class logits and boxes, with the text queries embedded once
    for the whole batch (its own forward embeds them again for every frame, a third of a step's work
    for this small model); the same numbers (test/demo/test_detector.py).

    Args:
        model: the OwlViTForObjectDetection.
        text: the queries' 'input_ids' and 'attention_mask', (queries, length).
        pixels: (frames, 3, S, S) normalised pixel values.
    """
    feature_map, _ = model.image_embedder(pixel_values=pixels)
    count, rows, cols, width = feature_map.shape
    features = feature_map.reshape(count, rows * cols, width)
    queries = model.owlvit.get_text_features(**text).pooler_output
    # A query whose first token is 0 is padding to OWL, as in its forward.
    mask = (text['input_ids'][:, 0] > 0)[None].expand(count, -1)
    logits, _ = model.class_predictor(features, queries[None].expand(count, -1, -1), mask)
    return logits, model.box_predictor(features, feature_map)


def calibrate(
    backend: Any, scenes: SceneSet, shifts: tuple[float, ...] = CALIBRATION_SHIFTS
) -> dict[str, Any]:
    """Choose the class head's logit shift (its bias) at which the backend, at its family's score
    threshold, answers the frames of `scenes` with the highest F1 of precision and recall at IoU 0.5
    (`evaluation.detection_accuracy`), the most precise of those within CALIBRATION_F1_SLACK of it;
    the backend's model keeps that shift.

    A detector's operating point is its threshold; the owlvit family's is fixed (0.1), so the model
    carries its own operating point in its scores, as a released one does for its threshold.

    Returns:
        'shift': the change applied; 'precision', 'recall', 'f1' at it; 'table': every shift tried,
        with its precision and recall.
    """
    import torch

    from metavlm_ros.demo.evaluation import detection_accuracy

    bias = backend.model.class_head.logit_shift.bias
    start = float(bias.item())
    table = []
    for shift in shifts:
        with torch.no_grad():
            bias.fill_(start + shift)
        accuracy = detection_accuracy(backend, scenes)
        both = accuracy['precision'] + accuracy['recall']
        f1 = 2 * accuracy['precision'] * accuracy['recall'] / both if both else 0.0
        table.append(
            {'shift': shift, 'precision': accuracy['precision'], 'recall': accuracy['recall'], 'f1': f1}
        )
    # A shift at which nothing is found has no precision (NaN): it counts as 0 here.
    f1 = [float(np.nan_to_num(row['f1'])) for row in table]
    best = max(
        (row for row, value in zip(table, f1, strict=True) if value >= max(f1) - CALIBRATION_F1_SLACK),
        key=lambda row: (float(np.nan_to_num(row['precision'])), -abs(row['shift'])),
    )
    with torch.no_grad():
        bias.fill_(start + best['shift'])
    return {**best, 'table': table}


def train_detector(
    train: SceneSet, config: TrainingConfig, out: Path, log: Callable[[str], None], *, clip_dir: Path
) -> dict[str, Any]:
    """Train the demo detector from the CLIP in `clip_dir` on the scenes' true boxes, calibrate it on the
    first `detector_calibration_frames` training frames (`calibrate`) and save it under `out`.

    Returns:
        'loss_curve': the mean loss every `log_every` steps; 'calibration': what `calibrate` chose.
    """
    import torch
    from transformers import OwlViTProcessor
    from transformers.models.owlvit.image_processing_pil_owlvit import OwlViTImageProcessorPil

    from metavlm_ros.common.errors import ParameterError
    from metavlm_ros.models.backends.clip import prompts_for
    from metavlm_ros.models.vlm import create_backend

    model, tokenizer = owl_from_clip(clip_dir, config.seed, config.detector_image_size)
    vision = model.config.vision_config
    if train.small.shape[1] != vision.image_size:
        raise ParameterError(
            f'training frames of {train.small.shape[1]} px for a {vision.image_size} px detector'
        )
    log(f'detector towers from {clip_dir}')
    defaults = prompts_for(CLASSES, 'default', None)
    phrasings = [
        [
            defaults[c],
            *sorted({t.format(p) for t in CLIP_TEMPLATES for p in CLASS_PHRASES[c]} - {defaults[c]}),
        ]
        for c in CLASSES
    ]
    text = [
        tokenizer(p, padding='max_length', max_length=OWL_TEXT_LENGTH, truncation=True, return_tensors='pt')
        for p in phrasings
    ]
    # The CLIP's text tower stays as it was: the queries keep the meaning it learnt from every phrasing
    # of the classes, so other prompts than the default still point at the same objects.
    model.owlvit.text_model.requires_grad_(False)
    model.owlvit.text_projection.requires_grad_(False)
    heads = [p for n, p in model.named_parameters() if not n.startswith('owlvit.')]
    tower = [p for n, p in model.named_parameters() if n.startswith('owlvit.vision_model.')]
    optimiser = torch.optim.AdamW(
        [{'params': heads, 'scale': 1.0}, {'params': tower, 'scale': config.detector_vision_lr_scale}],
        lr=config.detector_lr,
        weight_decay=0.05,
    )
    grid = vision.image_size // vision.patch_size
    min_area = config.detector_min_pixels / vision.image_size**2
    rng = np.random.default_rng(config.seed)
    curve: list[float] = []
    running: list[float] = []
    model.train()
    for step in range(config.detector_steps):
        for group in optimiser.param_groups:
            group['lr'] = group['scale'] * lr_schedule(step, config.detector_steps, config.detector_lr)
        idx = rng.choice(len(train.small), config.detector_batch_size, replace=False)
        small, rows = detection_batch(train, idx, rng, config)
        pixels = _pixels(small, rng.uniform(*config.gain_range, len(idx)))
        # One phrasing per class this step: the default prompt half the time, else another.
        pick = [0 if rng.random() < DEFAULT_PROMPT_SHARE else int(rng.integers(1, len(p))) for p in phrasings]
        queries = {
            key: torch.cat([t[key][k : k + 1] for t, k in zip(text, pick, strict=True)])
            for key in ('input_ids', 'attention_mask')
        }
        logits, predicted = detector_outputs(model, queries, pixels)
        if config.detector_targets == 'dense':
            targets = dense_box_targets(rows, grid, min_area)
        else:
            answered = (logits.detach().sigmoid().numpy(), predicted.detach().numpy())
            targets = (*box_targets(rows, grid, min_area, answered), None)
        loss, entropy, l1, giou = detection_loss(logits, predicted, *targets)
        classes = targets[0]
        optimiser.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimiser.step()
        running.append(loss.item())
        if (step + 1) % config.log_every == 0 or step + 1 == config.detector_steps:
            curve.append(float(np.mean(running)))
            log(
                f'detector step {step + 1}/{config.detector_steps} loss {curve[-1]:.4f} '
                f'(classes {entropy.item():.3f}, l1 {l1.item():.4f}, giou {giou.item():.3f}, '
                f'objects {int((classes >= 0).sum())})'
            )
            running = []
    model.eval()
    size = {'height': vision.image_size, 'width': vision.image_size}
    processor = OwlViTProcessor(
        image_processor=OwlViTImageProcessorPil(size=size, crop_size=size), tokenizer=tokenizer
    )
    out.mkdir(parents=True, exist_ok=True)
    if config.detector_targets == 'dense':
        # Many patches answer one object: the detector keeps the best box of each (backends/detector.py).
        model.config.nms_iou = config.detector_nms_iou
    processor.save_pretrained(out)
    model.save_pretrained(out, safe_serialization=True)
    backend = create_backend('detector', str(out), device='cpu')
    count = min(config.detector_calibration_frames, len(train.small))
    # The 16:9 copies where kept (what a camera gives); else the model inputs themselves.
    frames = list(train.mid[:count]) if train.mid is not None else list(train.small[:count])
    calibration = calibrate(
        backend, SceneSet(frames, train.small[:count], train.counts[:count], [], boxes=train.boxes[:count])
    )
    log(
        f'detector calibrated on {count} training frames: logit shift {calibration["shift"]:+.2f}, '
        f'precision {calibration["precision"]:.3f}, recall {calibration["recall"]:.3f} at the threshold '
        f'{backend.score_threshold:g}'
    )
    backend.model.save_pretrained(out, safe_serialization=True)
    return {'loss_curve': curve, 'calibration': calibration | {'frames': count}}
