"""Model updates for the demo's regression gate: copies of a demo model as a team would ship them."""

from __future__ import annotations

import shutil
from pathlib import Path

__all__ = ['PATCH_EMBEDDING', 'damaged_copy', 'quantised_copy']

WEIGHTS = 'model.safetensors'
#: The CLIP vision tower's first layer: the pixels' way into the model.
PATCH_EMBEDDING = 'vision_model.embeddings.patch_embedding.weight'


def quantised_copy(source: Path, target: Path, bits: int = 8) -> Path:
    """A copy of the model directory `source` whose weight matrices are quantised to `bits` bits, as
    weight-only quantisation for a robot's computer does: each row rounded to 2**(bits-1) - 1
    symmetric levels of its largest magnitude. Stored dequantised (float32) so every backend loads it
    as it is; biases and norms stay as they are."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, target)
    weights = load_file(str(source / WEIGHTS))
    levels = 2 ** (bits - 1) - 1
    for name, value in weights.items():
        if value.is_floating_point() and value.ndim >= 2:
            scale = value.abs().amax(dim=-1, keepdim=True) / levels
            scale[scale == 0] = 1.0
            weights[name] = torch.round(value / scale).clamp(-levels, levels) * scale
    save_file(weights, str(target / WEIGHTS), metadata={'format': 'pt'})
    return target


def damaged_copy(source: Path, target: Path, scale: float = 3.0, seed: int = 0) -> Path:
    """A copy of a demo CLIP with its patch embedding damaged: Gaussian noise of `scale` times the
    weights' spread (seeded), what a broken conversion of the first layer does. Its answers depend on
    pixel patterns the scene does not: small changes move them more."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, target)
    weights = load_file(str(source / WEIGHTS))
    value = weights[PATCH_EMBEDDING]
    noise = torch.randn(value.shape, generator=torch.Generator().manual_seed(seed), dtype=value.dtype)
    weights[PATCH_EMBEDDING] = value + scale * value.std() * noise
    save_file(weights, str(target / WEIGHTS), metadata={'format': 'pt'})
    return target
