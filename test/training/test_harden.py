"""Hardening a tiny CLIP and a tiny SigLIP: the blend chosen on held-out frames, a run killed and resumed
ends with the weights of an uninterrupted one, and the saved model loads again in its backend."""

import numpy as np
import pytest
import torch

from metavlm_ros.common.errors import InputError, ParameterError
from metavlm_ros.method.encoding import SearchSpace
from metavlm_ros.models.vlm import create_backend
from metavlm_ros.training.card import save_model
from metavlm_ros.training.followups import FollowupPlan, TrainingRegion
from metavlm_ros.training.harden import ALPHAS, CHECKPOINT, HardenSettings, harden

PLAN = FollowupPlan.of(
    [TrainingRegion('roll', SearchSpace.from_options(enabled=['rotation'], ranges={'rotation': (-5, 5)}))]
)
SETTINGS = HardenSettings(steps=4, batch=3, checkpoint_every=2, validation_followups=2, method='full')


class Interrupt:
    """A progress callback that presses Ctrl-C after `at` steps."""

    def __init__(self, at):
        self.at = at

    def __call__(self, step, steps, loss):
        if step == self.at:
            raise KeyboardInterrupt


@pytest.fixture(scope='module')
def uninterrupted(tiny_clip_dir, training_frames, tmp_path_factory):
    backend = create_backend('clip', str(tiny_clip_dir))
    done = harden(backend, training_frames, PLAN, tmp_path_factory.mktemp('whole'), SETTINGS)
    return done, {k: v.clone() for k, v in backend.model.state_dict().items()}


def test_the_blend_is_chosen_on_frames_never_trained_on(uninterrupted, training_frames):
    done, _ = uninterrupted
    assert set(done.blends) == set(ALPHAS) and done.alpha in ALPHAS
    assert not set(done.train) & set(done.validation)
    assert len(done.train) + len(done.validation) == len(training_frames)
    assert len(done.losses) == SETTINGS.steps and all(np.isfinite(done.losses))
    # The blend kept has the lowest violation rate of those that keep the clean behaviour, the base
    # always among them: ground truth on every frame here, but 3 validation frames are too few for a
    # presence AUC (MIN_AUC_FRAMES a side), so clean drift decides.
    base = done.blends[0.0]
    assert base.accuracy is None and base.measure == 'presence AUC'
    kept = {a: f for a, f in done.blends.items() if f.clean_drift <= SETTINGS.max_drift}
    assert 0.0 in kept and done.after.violation_rate == min(f.violation_rate for f in kept.values())


def test_a_killed_run_resumes_to_the_same_weights(tiny_clip_dir, training_frames, uninterrupted, tmp_path):
    backend = create_backend('clip', str(tiny_clip_dir))
    with pytest.raises(KeyboardInterrupt):
        harden(backend, training_frames, PLAN, tmp_path, SETTINGS, progress=Interrupt(3))
    assert torch.load(tmp_path / CHECKPOINT, weights_only=False)['step'] == 3
    with pytest.raises(InputError, match='other settings'):
        harden(backend, training_frames, PLAN, tmp_path, HardenSettings(steps=5), resume=True)
    backend = create_backend('clip', str(tiny_clip_dir))
    done = harden(backend, training_frames, PLAN, tmp_path, SETTINGS, resume=True)
    whole, weights = uninterrupted
    assert done.resumed_at == 3 and done.losses == pytest.approx(whole.losses, rel=1e-6)
    assert done.alpha == whole.alpha
    for name, value in backend.model.state_dict().items():
        # Same process, same batches and follow-ups: equal but for the last bits of float sums.
        torch.testing.assert_close(value, weights[name], rtol=1e-5, atol=1e-6)


def test_a_hardened_siglip_with_lora_saves_in_its_base_form(tiny_model_dirs, training_frames, tmp_path):
    backend = create_backend('siglip', str(tiny_model_dirs('siglip')))
    settings = HardenSettings(steps=2, batch=2, validation_followups=1, method='lora', rank=2)
    done = harden(backend, training_frames, PLAN, tmp_path / 'work', settings)
    assert done.method == 'lora' and done.trainable_parameters > 0
    save_model(backend, tmp_path / 'model')
    frames = [f.rgb for f in training_frames[:3]]
    again = create_backend('siglip', str(tmp_path / 'model'))
    for ours, theirs in zip(backend.predict(frames), again.predict(frames), strict=True):
        assert ours.values == pytest.approx(theirs.values, abs=1e-5)
    assert not any('lora' in k for k in again.model.state_dict())


def test_a_hardened_blip_learns_its_base_answers_and_saves_in_its_base_form(
    tiny_blip_dir, training_frames, tmp_path
):
    backend = create_backend('blip', str(tiny_blip_dir), max_new_tokens=8)
    frames = [f.rgb for f in training_frames[:4]]
    answers = [p.text for p in backend.predict(frames)]
    inputs = backend.image_inputs(frames)
    own = float(backend.answer_loss(inputs, answers))
    # Teacher forcing in generate's layout: the model's own greedy answers are the likeliest it can
    # give, so another answer costs more.
    assert own < float(backend.answer_loss(inputs, ['animals: 7 crabs, vegetation: none'] * 4))
    settings = HardenSettings(steps=2, batch=2, validation_followups=1, method='full')
    done = harden(backend, training_frames[:5], PLAN, tmp_path / 'work', settings)
    assert done.method == 'full' and len(done.losses) == 2 and all(np.isfinite(done.losses))
    save_model(backend, tmp_path / 'model')
    again = create_backend('blip', str(tmp_path / 'model'), max_new_tokens=8)
    assert [p.text for p in again.predict(frames)] == [p.text for p in backend.predict(frames)]


def test_a_backend_without_gradients_is_refused_before_any_work(training_frames, tmp_path):
    from test.fakes import ImageStatsBackend

    with pytest.raises(ParameterError, match='hardening takes in-process confidence'):
        harden(ImageStatsBackend(), training_frames, PLAN, tmp_path, SETTINGS)
    assert not tmp_path.joinpath(CHECKPOINT).exists()
