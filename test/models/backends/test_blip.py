"""BLIP's pixel scores (models/backends/blip.py): its own answer's log-probability, from the pixels."""

import pytest
import torch

from metavlm_ros.models.vlm import create_backend
from test.conftest import make_frame


@pytest.fixture(scope='module')
def blip(tiny_blip_dir):
    return create_backend('blip', str(tiny_blip_dir), device='cpu', max_new_tokens=6)


def _pixels(frame):
    return torch.from_numpy(frame).permute(2, 0, 1)[None].float()


def test_pixel_scores_are_the_answer_log_probability_with_gradients(blip):
    # At the model's input size the differentiable path gives the pixel values predict gives.
    frame = make_frame(blip.input_size, blip.input_size, seed=4)
    pixels = _pixels(frame).requires_grad_()
    scores = blip.pixel_scores(pixels)
    assert scores.shape == (1, len(blip.classes)) and torch.isfinite(scores).all()
    assert (scores[0] == scores[0, 0]).all() and scores[0, 0] < 0  # the whole answer, in every column
    scores[0, 0].backward()
    assert torch.isfinite(pixels.grad).all() and pixels.grad.abs().max() > 0
    # answer_loss (harden's) is the mean cross-entropy of the answer's tokens and its [SEP]: the same
    # number, where the answer's text gives back its tokens and the answer ended within max_new_tokens.
    (prediction,) = blip.predict([frame])
    tokens = blip.processor.tokenizer(prediction.text, add_special_tokens=False)['input_ids']
    assert 0 < len(tokens) < blip.max_new_tokens  # comparable: ended by [SEP]
    with torch.no_grad():
        loss = blip.answer_loss(blip.image_inputs([frame]), [prediction.text])
    assert scores[0, 0].item() == pytest.approx(-float(loss) * (len(tokens) + 1), rel=1e-5)


def test_a_batch_scores_each_frame_by_its_own_answer(blip):
    frames = [make_frame(48, 40, seed=1), make_frame(48, 40, seed=2)]
    together = blip.pixel_scores(torch.cat([_pixels(f) for f in frames]))
    alone = [blip.pixel_scores(_pixels(f))[0, 0] for f in frames]
    assert together[:, 0].tolist() == pytest.approx([a.item() for a in alone], rel=1e-5)
