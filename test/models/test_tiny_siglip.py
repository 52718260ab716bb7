"""Tiny SigLIP and SigLIP 2 (models/tiny_siglip.py): they load offline and score every class prompt."""

import pytest
import torch
from PIL import Image

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.models.tiny_siglip import build_tiny_siglip
from metavlm_ros.models.vlm import DEFAULT_CLASS_PROMPTS
from test.conftest import make_frame

OFFLINE = {'local_files_only': True, 'trust_remote_code': False}


@pytest.mark.parametrize(('version', 'model_class'), [(1, 'SiglipModel'), (2, 'Siglip2Model')])
def test_siglip_loads_and_scores_every_class_prompt(version, model_class, tmp_path):
    from transformers import AutoModel, AutoProcessor

    directory = build_tiny_siglip(tmp_path / 'siglip', version=version)
    processor = AutoProcessor.from_pretrained(directory, **OFFLINE)
    model = AutoModel.from_pretrained(directory, use_safetensors=True, **OFFLINE)
    assert type(model).__name__ == model_class
    prompts = list(DEFAULT_CLASS_PROMPTS.values())
    # Frames of two aspect ratios: SigLIP 2 keeps each one's aspect (its spatial_shapes differ).
    images = [Image.fromarray(make_frame(64, 40, seed=1)), Image.fromarray(make_frame(40, 64, seed=2))]
    inputs = processor(text=prompts, images=images, padding='max_length', return_tensors='pt')
    with torch.inference_mode():
        logits = model(**inputs).logits_per_image
    assert logits.shape == (2, len(prompts))
    assert torch.isfinite(logits).all()
    if version == 2:
        shapes = inputs['spatial_shapes'].tolist()
        assert shapes[0] != shapes[1]


def test_siglip_version_is_checked(tmp_path):
    with pytest.raises(ParameterError, match='SigLIP version must be 1 or 2'):
        build_tiny_siglip(tmp_path, version=3)
