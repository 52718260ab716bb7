"""SigLIP and SigLIP 2 as confidence models: per-class sigmoid probabilities, batched as one by one."""

import numpy as np
import pytest

from metavlm_ros.common.errors import ModelError
from metavlm_ros.models.tiny import build_tiny_model
from metavlm_ros.models.vlm import create_backend
from test.conftest import make_frame

FRAMES = [make_frame(64 + 8 * i, 48 + 4 * i, seed=i) for i in range(4)]


@pytest.fixture(scope='module', params=[1, 2], ids=['siglip', 'siglip2'])
def siglip_dir(request, tmp_path_factory):
    return build_tiny_model(
        'siglip', tmp_path_factory.mktemp(f'siglip{request.param}'), version=request.param
    )


def _reference(directory, prompts, frames, image_processor):
    """The model's own forward pass, as transformers documents zero-shot SigLIP: sigmoid(logits_per_image),
    its frames through the image processor of that backend ('pil' or 'torchvision')."""
    import torch
    from PIL import Image
    from transformers import AutoImageProcessor, AutoModel, AutoProcessor

    images = AutoImageProcessor.from_pretrained(directory, backend=image_processor)
    processor = AutoProcessor.from_pretrained(directory, image_processor=images)
    model = AutoModel.from_pretrained(directory).eval()
    length = model.config.text_config.max_position_embeddings
    inputs = processor(
        text=prompts,
        images=[Image.fromarray(f) for f in frames],
        padding='max_length',
        max_length=length,
        return_tensors='pt',
    )
    with torch.inference_mode():
        return torch.sigmoid(model(**inputs).logits_per_image).numpy()


@pytest.mark.parametrize('image_processor', ['pil', 'torchvision'])
def test_siglip_confidences_are_the_models_own_sigmoid_probabilities(siglip_dir, image_processor):
    backend = create_backend(
        'siglip', str(siglip_dir), device='cpu', preprocess='processor', image_processor=image_processor
    )
    assert backend.kind == 'confidence'
    got = np.array([list(p.values.values()) for p in backend.predict(FRAMES)])
    prompts = [backend.class_prompts[c] for c in backend.classes]
    expected = _reference(siglip_dir, prompts, FRAMES, image_processor)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert ((got > 0) & (got < 1)).all()
    # Each class on its own (a sigmoid, not a softmax): rows need not sum to one.
    assert not np.allclose(got.sum(axis=1), 1.0)


def test_siglip_batched_and_one_by_one_agree(siglip_dir):
    batched = create_backend('siglip', str(siglip_dir), device='cpu', batch_size=4).predict(FRAMES)
    single = create_backend('siglip', str(siglip_dir), device='cpu', batch_size=1).predict(FRAMES)
    for a, b in zip(batched, single, strict=True):
        np.testing.assert_allclose(list(a.values.values()), list(b.values.values()), atol=1e-6)


def test_siglip_batched_pixel_path_follows_the_processor(tmp_path):
    directory = build_tiny_model('siglip', tmp_path / 's', version=1)
    batched = create_backend('siglip', str(directory), device='cpu')
    reference = create_backend('siglip', str(directory), device='cpu', preprocess='processor')
    assert batched._pixel_path is not None  # SigLIP's fixed resize is one PIL resize per frame
    for a, b in zip(batched.predict(FRAMES), reference.predict(FRAMES), strict=True):
        np.testing.assert_allclose(list(a.values.values()), list(b.values.values()), atol=1e-5)


def test_a_checkpoint_that_is_not_siglip_is_refused(tiny_clip_dir):
    with pytest.raises(ModelError, match='is a clip model, not SigLIP or SigLIP 2'):
        create_backend('siglip', str(tiny_clip_dir), device='cpu')


def test_siglip_takes_the_prompt_presets_and_class_prompts(tmp_path):
    from metavlm_ros.models.questions import PAPER_CLASS_PROMPTS

    directory = build_tiny_model('siglip', tmp_path / 's', version=1)
    paper = create_backend(
        'siglip', str(directory), device='cpu', prompts='paper', class_prompts=['', '', '', 'a can']
    )
    assert paper.class_prompts == {**PAPER_CLASS_PROMPTS, 'trash': 'a can'}
