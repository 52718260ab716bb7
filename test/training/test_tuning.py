"""What hardening trains and how it goes back: the vision tower in full or LoRA adapters merged into
it (the text tower untouched, the layout the base's), and WiSE-FT's weight-space blend."""

import pytest
import torch

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.models.vlm import create_backend
from metavlm_ros.training import tuning
from metavlm_ros.training.tuning import attach, blend, choose_method


def test_the_blend_interpolates_every_float_tensor_and_keeps_the_rest():
    base = {'w': torch.zeros(3), 'ids': torch.arange(3)}
    tuned = {'w': torch.full((3,), 4.0), 'ids': torch.arange(3) + 1}
    assert torch.equal(blend(base, tuned, 0.0)['w'], base['w'])
    assert torch.equal(blend(base, tuned, 1.0)['w'], tuned['w'])
    assert torch.allclose(blend(base, tuned, 0.25)['w'], torch.full((3,), 1.0))
    assert torch.equal(blend(base, tuned, 0.25)['ids'], tuned['ids'])
    with pytest.raises(ParameterError, match='alpha'):
        blend(base, tuned, 1.5)
    with pytest.raises(ParameterError, match='layouts'):
        blend(base, {'w': tuned['w']}, 0.5)


def _step(model, trainable):
    """One optimiser step that moves every trainable weight."""
    optimiser = torch.optim.SGD(trainable.values(), lr=0.1)
    loss = sum((p.float() ** 2).sum() + p.float().sum() for p in trainable.values())
    loss.backward()
    optimiser.step()


@pytest.mark.parametrize('method', ['full', 'lora'])
def test_only_the_vision_tower_moves_and_the_layout_stays_the_base(tiny_clip_dir, monkeypatch, method):
    backend = create_backend('clip', str(tiny_clip_dir))
    model = backend.model
    assert choose_method(model, 'auto') == 'full'  # a tiny tower is fine-tuned in full
    monkeypatch.setattr(tuning, 'FULL_LIMIT', 0)
    assert choose_method(model, 'auto') == 'lora'
    before = {k: v.clone() for k, v in model.state_dict().items()}
    tuned = attach(model, method, rank=2)
    assert tuned.trainable and all('vision_model' in n or 'visual_projection' in n for n in tuned.trainable)
    if method == 'lora':
        assert all('lora_' in name for name in tuned.trainable)
    _step(model, tuned.trainable)
    after = tuned.finish().state_dict()
    assert set(after) == set(before)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.startswith(('vision_model.', 'visual_projection.')) for k in changed)
    assert not any(p.requires_grad for p in model.parameters())


def test_a_model_without_a_vision_tower_or_a_bad_method_is_refused(tiny_clip_dir):
    backend = create_backend('clip', str(tiny_clip_dir))
    with pytest.raises(ParameterError, match='no vision tower'):
        choose_method(backend.model.text_model, 'auto')
    with pytest.raises(ParameterError, match='--method'):
        choose_method(backend.model, 'everything')
