"""Tiny VLM and SmolVLM-shaped builders (models/tiny_families.py): they load through the Auto classes."""

import sys

import numpy as np
import pytest

from metavlm_ros.common.errors import ModelError, ParameterError
from metavlm_ros.method.prediction import CLASSES
from metavlm_ros.models.tiny_families import (
    FAMILIES,
    REQUIRED_WORDS,
    VIDEO_FAMILIES,
    build_base_vlm,
    build_tiny_vlm,
)
from metavlm_ros.models.vlm import weights_hash

PROCESSORS = {
    'qwen2_vl': 'Qwen2VLProcessor',
    'qwen2_5_vl': 'Qwen2_5_VLProcessor',
    'qwen3_vl': 'Qwen3VLProcessor',
    'idefics3': 'Idefics3Processor',
    'paligemma': 'PaliGemmaProcessor',
    'llava': 'LlavaProcessor',
    'llava_onevision': 'LlavaOnevisionProcessor',
    'gemma3': 'Gemma3Processor',
}
OFFLINE = {'local_files_only': True, 'trust_remote_code': False}


@pytest.mark.parametrize('family', FAMILIES)
def test_a_family_loads_with_the_auto_classes(family, tmp_path):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    directory = build_tiny_vlm(family, tmp_path / family)
    processor = AutoProcessor.from_pretrained(directory, **OFFLINE)
    model = AutoModelForImageTextToText.from_pretrained(directory, use_safetensors=True, **OFFLINE)
    assert type(processor).__name__ == PROCESSORS[family]
    assert model.config.model_type == family
    assert (
        sum(p.numel() for p in model.parameters()) < 200_000
    )  # tiny: builds and loads in well under a second
    assert processor.chat_template
    tokenizer = processor.tokenizer
    for word in REQUIRED_WORDS:
        assert len(tokenizer.encode(word, add_special_tokens=False)) == 1, word
    for word in ('yes', 'no', 'Yes', 'No', *CLASSES):
        assert len(tokenizer.encode(' ' + word, add_special_tokens=False)) == 1, word
    assert len(tokenizer) <= model.config.get_text_config().vocab_size


def test_the_same_seed_gives_the_same_weights(tmp_path):
    first = weights_hash(build_tiny_vlm('idefics3', tmp_path / 'a', seed=3))
    assert weights_hash(build_tiny_vlm('idefics3', tmp_path / 'b', seed=3)) == first
    assert weights_hash(build_tiny_vlm('idefics3', tmp_path / 'c', seed=4)) != first


def test_an_unknown_family_is_refused(tmp_path):
    with pytest.raises(ParameterError, match="unknown tiny VLM family 'kosmos2'"):
        build_tiny_vlm('kosmos2', tmp_path)


def test_the_base_model_has_smolvlm_256m_shape(tmp_path):
    from transformers import AutoConfig, AutoProcessor

    directory = build_base_vlm(tmp_path / 'base')
    config = AutoConfig.from_pretrained(directory, **OFFLINE)
    processor = AutoProcessor.from_pretrained(directory, **OFFLINE)
    assert config.model_type == 'idefics3'
    assert (config.vision_config.num_hidden_layers, config.vision_config.hidden_size) == (12, 768)
    assert (config.text_config.num_hidden_layers, config.text_config.hidden_size) == (30, 576)
    assert processor.image_seq_len == 64
    # The parameter count from the saved tensors' shapes, without loading 1 GB of weights.
    from safetensors import safe_open

    count = 0
    for path in directory.glob('*.safetensors'):
        with safe_open(str(path), framework='np') as handle:
            count += sum(int(np.prod(handle.get_slice(k).get_shape())) for k in handle.keys())
    assert 250e6 < count < 262e6


@pytest.mark.parametrize('family', VIDEO_FAMILIES)
def test_video_families_without_torchvision_are_refused_in_one_line(family, tmp_path, monkeypatch):
    # As on a robot whose environment has no torchvision: importing it finds nothing.
    monkeypatch.setitem(sys.modules, 'torchvision', None)
    with pytest.raises(ModelError, match=f'^{family} needs torchvision: ') as refused:
        build_tiny_vlm(family, tmp_path / family)
    assert '\n' not in str(refused.value)
    assert not (tmp_path / family / 'config.json').exists()
