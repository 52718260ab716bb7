"""Training of the demo BLIP: Table 1 answers, kept steady under small relations."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.demo.batches import (
    augmented_batch,
    dense_loss,
    lr_schedule,
    normalised_pixels,
    pad_rows,
    paired_indices,
    random_augmentation,
)
from metavlm_ros.demo.builders import (
    clip_vision_into_blip,
    demo_blip_tokenizer,
    demo_corpus,
    demo_vision_config,
)
from metavlm_ros.demo.config import TrainingConfig
from metavlm_ros.demo.evaluation import blip_answers
from metavlm_ros.demo.scenes import SceneSet
from metavlm_ros.method.prediction import CLASSES
from metavlm_ros.models.counts import parse_counts

__all__ = ['train_blip']

# Counts above this are one class of the auxiliary counting head (rare in the generator's scenes).
_MAX_AUX_COUNT = 8


def _neighbourhood_answers(
    teacher: Any, train: SceneSet, answers: list[str], config: TrainingConfig
) -> tuple[list[str], float]:
    """For each training frame, the teacher's most frequent answer over the frame and
    `config.blip_teacher_votes` transformed copies of it (compositions drawn as the augmentation
    draws them, seeded by `config.seed`); answers vote by their parsed counts, ties go to the
    frame's own answer. Returns the answers and the fraction of frames whose answer changed.
    """
    from collections import Counter

    from metavlm_ros.method.relations import apply_composition

    if train.mid is None:
        raise ParameterError('blip_teacher_votes needs the training frames at the augmentation size')
    rng = np.random.default_rng(config.seed + 2)
    chosen, changed = [], 0
    for i, own in enumerate(answers):
        copies = [
            apply_composition(train.mid[i], random_augmentation(rng, config.augment_magnitude))
            for _ in range(config.blip_teacher_votes)
        ]
        texts = [own, *blip_answers(teacher, copies, batch_size=64)]
        keys = [tuple(sorted(parse_counts(text).items())) for text in texts]
        votes = Counter(keys)
        best = max(votes.values())
        # The first answer with the most votes: the frame's own (index 0) whenever it is among them.
        winner = next(j for j, key in enumerate(keys) if votes[key] == best)
        chosen.append(texts[winner])
        changed += winner > 0
    return chosen, changed / max(1, len(answers))


def _answer_divergence(logits: Any, labels: Any, pairs: int) -> Any:
    """Mean symmetric Kullback-Leibler divergence between the next-token distributions of the last
    `pairs` rows of a batch and the first `pairs` rows (the same frames and target, one copy
    transformed), over the positions that predict an answer token (label not -100).
    """
    from torch.nn import functional

    # Position t predicts token t + 1, as the model's own loss shifts them.
    mask = (labels[:pairs, 1:] != -100).float()
    first = functional.log_softmax(logits[:pairs, :-1], dim=-1)
    second = functional.log_softmax(logits[-pairs:, :-1], dim=-1)
    per_position = ((first.exp() - second.exp()) * (first - second)).sum(dim=-1)
    return (per_position * mask).sum() / mask.sum().clamp(min=1.0)


def train_blip(
    train: SceneSet,
    config: TrainingConfig,
    out: Path,
    log: Callable[[str], None],
    vision_from: Path | None = None,
) -> list[float]:
    """Train the demo BLIP to answer the Table 1 prompt by teacher forcing; save it under `out`.

    With `vision_from` (a trained demo CLIP), the vision tower starts from the CLIP's: counting is
    learned much faster from features that already tell the classes apart.
    """
    import torch
    from torch.nn import functional
    from transformers import BlipConfig, BlipForConditionalGeneration, BlipImageProcessor, BlipProcessor

    from metavlm_ros.models.vlm import TABLE1_PROMPT

    start = Path(config.init_from) / 'demo-blip' if config.init_from else None
    if start is not None:
        tokenizer = BlipProcessor.from_pretrained(start, local_files_only=True).tokenizer
    else:
        tokenizer = demo_blip_tokenizer(demo_corpus(train.captions))
    model_config = BlipConfig(
        text_config={
            'vocab_size': len(tokenizer),
            'hidden_size': 96,
            'intermediate_size': 192,
            'num_hidden_layers': 2,
            'num_attention_heads': 4,
            'max_position_embeddings': 160,
            'encoder_hidden_size': config.vision_hidden,
            'bos_token_id': tokenizer.bos_token_id,
            'eos_token_id': tokenizer.sep_token_id,
            'sep_token_id': tokenizer.sep_token_id,
            'pad_token_id': tokenizer.pad_token_id,
        },
        vision_config=demo_vision_config(config),
    )
    torch.manual_seed(config.seed)
    model = BlipForConditionalGeneration(model_config)
    if start is not None:
        model = BlipForConditionalGeneration.from_pretrained(
            start, local_files_only=True, use_safetensors=True
        )
        log(f'blip initialised from {start}')
        vision_from = None  # its own trained tower, not a CLIP's
    elif vision_from is not None:
        clip_vision_into_blip(vision_from, model)
        log(f'blip vision tower initialised from {vision_from}')
    # An auxiliary per-class count classifier on the image embedding (not saved) gives the vision encoder
    # a direct counting signal early, which the decoder then reads through cross-attention.
    aux = torch.nn.Linear(config.vision_hidden, len(CLASSES) * (_MAX_AUX_COUNT + 1))
    dense_head = torch.nn.Linear(config.vision_hidden, 2 * len(CLASSES))
    # generate() replaces the prompt's [CLS] with [DEC] and drops its final [SEP]; train on that layout.
    prompt = tokenizer(TABLE1_PROMPT, add_special_tokens=False)['input_ids']
    prefix = [tokenizer.bos_token_id, *prompt]
    captions = train.captions
    if config.blip_teacher_answers:
        from metavlm_ros.models.vlm import create_backend

        # The starting BLIP through the normal backend, on the frames as the model sees them.
        teacher = create_backend('blip', str(start), device='cpu')
        captions = blip_answers(teacher, list(train.small), batch_size=64)
        if config.blip_teacher_votes:
            captions, changed = _neighbourhood_answers(teacher, train, captions, config)
            log(
                f'blip targets: the most frequent answer over each frame and {config.blip_teacher_votes} '
                f"transformed copies differs from the frame's own on {changed:.1%} of the frames"
            )
        same = np.mean([a == b for a, b in zip(captions, train.captions, strict=True)])
        log(f'blip learns the answers of {start} ({same:.1%} of them are the ground-truth caption)')
    rows, label_rows = [], []
    for text in captions:
        answer = [*tokenizer(text, add_special_tokens=False)['input_ids'], tokenizer.sep_token_id]
        rows.append(prefix + answer)
        label_rows.append([-100] * len(prefix) + answer)
    input_ids = torch.from_numpy(pad_rows(rows, tokenizer.pad_token_id))
    labels = torch.from_numpy(pad_rows(label_rows, -100))
    attention = (labels != -100) | (torch.arange(input_ids.shape[1])[None, :] < len(prefix))
    longest = max(len(a) - len(prefix) for a in label_rows)
    log(
        f'blip answers: up to {longest} tokens (the backend generates 40 by default); '
        f'prompt {len(prefix)} tokens'
    )
    aux_targets = torch.from_numpy(np.minimum(train.counts, _MAX_AUX_COUNT))
    params = [*model.parameters(), *aux.parameters(), *dense_head.parameters()]
    vision_ids = {id(p) for p in model.vision_model.parameters()}
    # A started vision tower learns at a third of the rate, so the decoder's first noisy gradients
    # do not wash out what it already knows.
    vision_scale = config.blip_vision_lr_scale if vision_from is not None else 1.0
    groups = [
        {'params': [p for p in params if id(p) in vision_ids], 'scale': vision_scale},
        {'params': [p for p in params if id(p) not in vision_ids], 'scale': 1.0},
    ]
    optimiser = torch.optim.AdamW(groups, lr=config.blip_lr, weight_decay=0.05)
    rng = np.random.default_rng(config.seed + 1)
    pairs = round(config.batch_size * config.blip_consistency_pairs) if config.blip_consistency_weight else 0
    curve: list[float] = []
    running = []
    model.train()
    for step in range(config.blip_steps):
        for group in optimiser.param_groups:
            group['lr'] = group['scale'] * lr_schedule(step, config.blip_steps, config.blip_lr)
        idx, always = paired_indices(rng, len(train.small), config.batch_size, pairs)
        width = int(attention[idx].sum(dim=1).max())
        small, density, coverage, flip = augmented_batch(train, idx, rng, config, always)
        pixels = normalised_pixels(small, flip, rng.uniform(*config.gain_range, len(idx)))
        output = model(
            pixel_values=pixels,
            input_ids=input_ids[idx, :width],
            attention_mask=attention[idx, :width].long(),
            labels=labels[idx, :width],
        )
        counting = functional.cross_entropy(
            aux(output.image_embeds[:, 0]).view(-1, _MAX_AUX_COUNT + 1), aux_targets[idx].reshape(-1)
        )
        dense = dense_loss(dense_head, output.image_embeds[:, 1:], density, coverage, flip, config)
        loss = output.loss + counting + dense
        consistency = torch.zeros(())
        if pairs:
            consistency = _answer_divergence(output.logits, labels[idx, :width], pairs)
            loss = loss + config.blip_consistency_weight * consistency
        optimiser.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimiser.step()
        running.append(output.loss.item())
        if (step + 1) % config.log_every == 0 or step + 1 == config.blip_steps:
            curve.append(float(np.mean(running)))
            log(
                f'blip step {step + 1}/{config.blip_steps} loss {curve[-1]:.4f} '
                f'(aux counting {counting.item():.3f}, dense {dense.item():.3f}, '
                f'consistency {consistency.item():.2e})'
            )
            running = []
    model.eval()
    size = {'height': config.image_size, 'width': config.image_size}
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    BlipProcessor(image_processor=BlipImageProcessor(size=size), tokenizer=tokenizer).save_pretrained(out)
    return curve
