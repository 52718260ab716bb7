"""Training of the demo CLIP: contrastive, distilled and dense per-patch losses."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from metavlm_ros.demo.batches import (
    augmented_batch,
    dense_loss,
    distill_target,
    lr_schedule,
    normalised_pixels,
    paired_indices,
)
from metavlm_ros.demo.builders import demo_clip_tokenizer, demo_corpus, demo_vision_config
from metavlm_ros.demo.config import CLASS_PHRASES, CLIP_TEMPLATES, TrainingConfig
from metavlm_ros.demo.scenes import SceneSet
from metavlm_ros.method.prediction import CLASSES

__all__ = ['train_clip']


def train_clip(train: SceneSet, config: TrainingConfig, out: Path, log: Callable[[str], None]) -> list[float]:
    """Train the demo CLIP contrastively on captions plus class-presence prompts; save it under `out`."""
    import torch
    from torch.nn import functional
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

    max_length = 48  # the longest Table 1 captions are about 40 BPE tokens
    start = Path(config.init_from) / 'demo-clip' if config.init_from else None
    if start is not None:
        # Fine-tuning: the trained model and its own tokenizer (its ids are what the weights know).
        tokenizer = CLIPProcessor.from_pretrained(start, local_files_only=True).tokenizer
    else:
        tokenizer = demo_clip_tokenizer(demo_corpus(train.captions), max_length)
    model_config = CLIPConfig(
        text_config={
            'vocab_size': len(tokenizer),
            'hidden_size': 64,
            'intermediate_size': 128,
            'num_hidden_layers': 2,
            'num_attention_heads': 2,
            'max_position_embeddings': max_length,
            'bos_token_id': tokenizer.bos_token_id,
            'eos_token_id': tokenizer.eos_token_id,
            'pad_token_id': tokenizer.pad_token_id,
        },
        vision_config=demo_vision_config(config),
        projection_dim=64,
    )
    torch.manual_seed(config.seed)
    model = CLIPModel(model_config)
    if start is not None:
        model = CLIPModel.from_pretrained(start, local_files_only=True, use_safetensors=True)
        log(f'clip initialised from {start}')
    unique = sorted(set(train.captions))
    position = {c: i for i, c in enumerate(unique)}
    caption_index = np.asarray([position[c] for c in train.captions])
    caption_ids = tokenizer(unique, padding=True, truncation=True, return_tensors='pt')
    prompts = [[t.format(p) for t in CLIP_TEMPLATES for p in CLASS_PHRASES[c]] for c in CLASSES]
    per_class = len(prompts[0])
    prompt_ids = tokenizer(sum(prompts, []), padding=True, return_tensors='pt')
    present = torch.from_numpy(train.counts > 0).float()
    teacher_cosine = None
    if config.clip_distill_weight:
        # The starting CLIP, frozen: its cosines on the untransformed frames are the targets.
        teacher = CLIPModel.from_pretrained(start, local_files_only=True, use_safetensors=True).eval()
        with torch.no_grad():
            teacher_text = teacher.text_model(**prompt_ids).pooler_output
            teacher_prompt = functional.normalize(teacher.text_projection(teacher_text))

        def teacher_cosine(small: np.ndarray, flip: np.ndarray | None = None) -> Any:
            with torch.no_grad():
                pooled = teacher.vision_model(pixel_values=normalised_pixels(small, flip)).pooler_output
                return functional.normalize(teacher.visual_projection(pooled)) @ teacher_prompt.T

        sample = train.small[: min(len(train.small), 512)]
        reference = torch.cat([teacher_cosine(sample[i : i + 64]) for i in range(0, len(sample), 64)])
        teacher_mean, teacher_std = reference.mean(dim=0), reference.std(dim=0).clamp_min(1e-4)
        log(
            f'clip distils from {start}: its prompt cosines {reference.min().item():.2f}..'
            f'{reference.max().item():.2f}, standard deviation per prompt '
            f'{teacher_std.min().item():.3f}..{teacher_std.max().item():.3f}'
        )
    # Presence logits are an affine map of the cosine, so training them shapes the cosine ranking
    # itself; the scale is fixed and high, so the classes separate within a narrow cosine band.
    presence_bias = torch.nn.Parameter(torch.zeros(len(CLASSES)))
    dense_head = torch.nn.Linear(config.vision_hidden, 2 * len(CLASSES))  # training only, not saved
    params = [*model.parameters(), presence_bias, *dense_head.parameters()]
    optimiser = torch.optim.AdamW(params, lr=config.clip_lr, weight_decay=0.05)
    rng = np.random.default_rng(config.seed)
    pairs = round(config.batch_size * config.clip_consistency_pairs) if config.clip_consistency_weight else 0
    curve: list[float] = []
    running = []
    model.train()
    for step in range(config.clip_steps):
        for group in optimiser.param_groups:
            group['lr'] = lr_schedule(step, config.clip_steps, config.clip_lr)
        idx, always = paired_indices(rng, len(train.small), config.batch_size, pairs)
        small, density, coverage, flip = augmented_batch(train, idx, rng, config, always)
        pixels = normalised_pixels(small, flip, rng.uniform(*config.gain_range, len(idx)))
        vision = model.vision_model(pixel_values=pixels)
        image = functional.normalize(model.visual_projection(vision.pooler_output))
        dense = dense_loss(dense_head, vision.last_hidden_state[:, 1:], density, coverage, flip, config)
        # Each distinct caption in the batch is one text; frames sharing a caption share the target.
        batch_captions, inverse = np.unique(caption_index[idx], return_inverse=True)
        text_out = model.text_model(
            input_ids=caption_ids['input_ids'][batch_captions],
            attention_mask=caption_ids['attention_mask'][batch_captions],
        )
        text = functional.normalize(model.text_projection(text_out.pooler_output))
        logits = model.logit_scale.exp() * image @ text.T
        contrastive = functional.cross_entropy(logits, torch.from_numpy(inverse))
        # Text side: each caption against the frames that carry it (soft targets).
        target = torch.zeros(len(batch_captions), len(idx))
        target[torch.from_numpy(inverse), torch.arange(len(idx))] = 1.0
        target /= target.sum(dim=1, keepdim=True)
        contrastive = 0.5 * (contrastive + functional.cross_entropy(logits.T, target))
        prompt_out = model.text_model(**prompt_ids)
        prompt = functional.normalize(model.text_projection(prompt_out.pooler_output))
        cosine = (image @ prompt.T).view(len(idx), len(CLASSES), per_class)
        offset = cosine - config.clip_cosine_centre
        presence_logits = config.clip_presence_scale * offset + presence_bias[None, :, None]
        labels = present[idx][:, :, None].expand_as(presence_logits)
        presence = functional.binary_cross_entropy_with_logits(presence_logits, labels)
        band = functional.relu(offset.abs() - config.clip_cosine_band).pow(2).mean()
        loss = config.clip_contrastive_weight * contrastive + 2.0 * presence + dense
        loss = loss + config.clip_band_weight * band
        distill = torch.zeros(())
        if teacher_cosine is not None:
            teacher_now = teacher_cosine(train.small[idx], flip)
            target = distill_target(teacher_now, teacher_mean, teacher_std, config)
            unit = config.clip_cosine_band / 3
            distill = ((cosine.reshape(len(idx), -1) - target) / unit).pow(2).mean()
            loss = loss + config.clip_distill_weight * distill
        consistency = torch.zeros(())
        if pairs:
            consistency = (presence_logits[-pairs:] - presence_logits[:pairs]).pow(2).mean()
            loss = loss + config.clip_consistency_weight * consistency
        optimiser.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimiser.step()
        with torch.no_grad():
            model.logit_scale.clamp_(0, math.log(100))
        running.append(loss.item())
        if (step + 1) % config.log_every == 0 or step + 1 == config.clip_steps:
            curve.append(float(np.mean(running)))
            log(
                f'clip step {step + 1}/{config.clip_steps} loss {curve[-1]:.4f} '
                f'(contrastive {contrastive.item():.3f}, presence {presence.item():.3f}, '
                f'dense {dense.item():.3f}, band {band.item():.5f}, consistency {consistency.item():.3f}, '
                f'distill {distill.item():.3f}, '
                f'cosine {cosine.min().item():.2f}..{cosine.max().item():.2f})'
            )
            running = []
    model.eval()
    size = {'height': config.image_size, 'width': config.image_size}
    image_processor = CLIPImageProcessor(size=size, crop_size=size, do_center_crop=False)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(out)
    return curve
