"""Hardening a tiny chat VLM (the vlm backend): the teacher-forced answer loss is the loss of the answers
`generate` gives, the confidences trained are the ones `predict` gives, only the vision tower is trained,
and the hardened model loads again in its backend answering as the one in memory."""

import numpy as np
import pytest
import torch

from metavlm_ros.models.tiny import build_tiny_model
from metavlm_ros.models.vlm import create_backend
from metavlm_ros.training.card import save_model
from metavlm_ros.training.harden import CHECKPOINT, HardenSettings, harden
from metavlm_ros.training.tuning import vision_parameters
from test.conftest import make_frame
from test.training.test_harden import PLAN

SETTINGS = HardenSettings(steps=2, batch=2, validation_followups=1, method='full')


@pytest.fixture(scope='module')
def qwen_dir(tmp_path_factory):
    return build_tiny_model('vlm', tmp_path_factory.mktemp('qwen2_vl'), family='qwen2_vl')


def test_a_hardened_chat_vlm_learns_its_base_answers_and_saves_in_its_base_form(
    qwen_dir, training_frames, tmp_path
):
    backend = create_backend('vlm', str(qwen_dir), max_new_tokens=3)
    frames = [f.rgb for f in training_frames[:4]]
    answers = [p.text for p in backend.predict(frames)]
    own = float(backend.answer_loss(frames, answers))
    # Teacher forcing after the prompt generate answers from: the model's own greedy answers are the
    # likeliest it can give, so another answer costs more.
    assert own < float(backend.answer_loss(frames, ['animals: 7 crabs, vegetation: none'] * 4))
    # Frames of other sizes are other numbers of image tokens: a row's loss does not depend on the
    # padding its batch gives it (positions as generate numbers them, Qwen2-VL's 3-D rope here).
    mixed = [make_frame(64, 48, seed=1), make_frame(32, 32, seed=2)]
    alone = [float(backend.answer_loss([f], answers[:1])) for f in mixed]
    assert float(backend.answer_loss(mixed, answers[:1] * 2)) == pytest.approx(np.mean(alone), rel=1e-4)

    base = {k: v.clone() for k, v in backend.model.state_dict().items()}
    tower = vision_parameters(backend.model)
    done = harden(backend, training_frames[:4], PLAN, tmp_path / 'work', SETTINGS)
    assert done.method == 'full' and len(done.losses) == 2 and all(np.isfinite(done.losses))
    # Only the vision tower (and its merger into the language model's embeddings) was trained, and it moved.
    assert done.trainable_parameters == sum(p.numel() for p in tower.values())
    assert not any(k.startswith(('model.language_model', 'lm_head')) for k in tower)
    trained = torch.load(tmp_path / 'work' / CHECKPOINT, weights_only=False)['trainable']
    assert set(trained) == set(tower) and any(not torch.equal(v, base[k]) for k, v in trained.items())
    backend.model.load_state_dict(trained, strict=False)  # the fine-tuned weights, whatever blend was kept
    save_model(backend, tmp_path / 'model')
    again = create_backend('vlm', str(tmp_path / 'model'), max_new_tokens=3)
    assert again.weights_hash() != create_backend('vlm', str(qwen_dir)).weights_hash()
    assert [p.text for p in again.predict(frames)] == [p.text for p in backend.predict(frames)]


def test_a_chat_vlm_hardened_on_confidences_with_lora_saves_in_its_base_form(
    tiny_model_dirs, training_frames, tmp_path
):
    model_dir = str(tiny_model_dirs('vlm'))  # Idefics3, as SmolVLM
    backend = create_backend('vlm', model_dir, kind='confidence')
    frames = [f.rgb for f in training_frames[:3]]
    # What is trained is what predict gives (there from one cached prefix per frame, here whole prompts).
    values = [[p.values[c] for c in backend.classes] for p in backend.predict(frames)]
    np.testing.assert_allclose(backend.scores(frames).detach().numpy(), values, atol=1e-5)
    settings = HardenSettings(steps=2, batch=2, validation_followups=1, method='lora', rank=2)
    done = harden(backend, training_frames[:4], PLAN, tmp_path / 'work', settings)
    assert done.method == 'lora' and 0 < done.trainable_parameters and all(np.isfinite(done.losses))
    save_model(backend, tmp_path / 'model')
    again = create_backend('vlm', str(tmp_path / 'model'), kind='confidence')
    for ours, theirs in zip(backend.predict(frames), again.predict(frames), strict=True):
        assert ours.values == pytest.approx(theirs.values, abs=1e-5)
    assert not any('lora' in k for k in again.model.state_dict())


def test_the_answer_taught_is_the_token_ids_generation_chose(tiny_model_dirs):
    # A tiny LLaVA's byte-level vocabulary splits its own decoded answer otherwise than generation did,
    # and its answers run to max_new_tokens without an end token: the text, tokenised again and ended,
    # is not what the model said. The ids are: teacher forcing them, every position's likeliest token is
    # the one generation chose (greedy), and they decode to predict's answer.
    backend = create_backend('vlm', str(tiny_model_dirs('vlm', family='llava')), max_new_tokens=6)
    frames = [make_frame(48, 36, seed=i) for i in range(3)]
    ids = backend.answer_ids(frames)
    texts = [p.text for p in backend.predict(frames)]
    assert backend.chat.prompt_format.decode(backend.chat.tokenizer, ids) == texts
    inputs = backend.chat.prompt_inputs(frames, [backend.asked.question] * len(frames))
    with torch.no_grad():
        logits, labels = backend._teacher_forced(inputs, ids)
        taught = labels != -100
        chosen = logits.gather(-1, labels.clamp(min=0)[..., None])[..., 0][taught]
        # Within float noise of the best (cached decoding and one teacher-forced pass round apart).
        assert (logits.amax(-1)[taught] - chosen).max() < 1e-4
        assert float(backend.answer_loss(frames, ids)) < float(backend.answer_loss(frames, texts))
