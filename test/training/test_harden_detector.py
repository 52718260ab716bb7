"""Hardening a detector: the base's boxes, carried through each change as the oracle carries them, are
what a follow-up is taught; the loss points the right way; tiny OWL-ViT, OWLv2 (LoRA, heads in full) and
Grounding DINO (in full: peft cannot wrap it) harden and save in their base form; clean accuracy is
detection F1 against the true boxes."""

import numpy as np
import pytest
import torch

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.method.boxes import Detection
from metavlm_ros.method.encoding import Composition, SearchSpace
from metavlm_ros.method.prediction import Prediction
from metavlm_ros.models.vlm import create_backend
from metavlm_ros.training.card import save_model
from metavlm_ros.training.followups import FollowupPlan, TrainingRegion
from metavlm_ros.training.harden import HardenSettings, harden
from metavlm_ros.training.objectives import DetectionObjective, objective_for
from metavlm_ros.training.tuning import attach, choose_method
from metavlm_ros.training.validation import FrameTruth, clean_accuracy, presence_auc

WIDTH, HEIGHT = 48, 36
PLAN = FollowupPlan.of(
    [TrainingRegion('shift', SearchSpace.from_options(enabled=['rotation', 'translation']), 0.5)]
)
CLASSES = ('animal', 'vegetation', 'object', 'trash')


def _answer(*found: Detection) -> Prediction:
    values = {c: float(sum(d.cls == c for d in found)) for c in CLASSES}
    return Prediction('detection', values, detections=tuple(found))


class _Classes:
    classes = CLASSES


def test_a_follow_up_is_taught_the_base_boxes_moved_by_the_change():
    teacher = [
        _answer(
            Detection('trash', 0.9, (10.0, 6.0, 20.0, 16.0)),
            Detection('animal', 0.5, (40.0, 20.0, 47.0, 30.0)),
        )
    ]
    objective = DetectionObjective(_Classes(), teacher)
    source = objective.objects(0, None, WIDTH, HEIGHT)
    np.testing.assert_allclose(source[0], [3, 15 / WIDTH, 11 / HEIGHT, 10 / WIDTH, 10 / HEIGHT, 1], rtol=1e-6)
    # A shift of 3 % of the width moves every box by int(48 * 0.03) = 1 pixel to the right; the animal,
    # at the right border, is clipped there and still taught (most of it stays in view).
    shifted = objective.objects(0, Composition.from_parameters({'translation': 0.03}), WIDTH, HEIGHT)
    np.testing.assert_allclose(shifted[0, 1:5], [16 / WIDTH, 11 / HEIGHT, 10 / WIDTH, 10 / HEIGHT], rtol=1e-6)
    np.testing.assert_allclose(shifted[1, [1, 3, 5]], [44.5 / WIDTH, 7 / WIDTH, 1], rtol=1e-6)
    # Under a rotation each edge is taught the middle of its band (the rotated object's box lies
    # between the inner and the outer box), and the box keeps its centre's image.
    # At 5 degrees a 10-pixel square's outer box is 10 (cos 5 + sin 5) = 10.83 pixels wide.
    turned = objective.objects(0, Composition.from_parameters({'rotation': 5.0}), WIDTH, HEIGHT)
    assert turned.shape == (2, 6) and 9.9 / WIDTH < turned[0, 3] < 10.83 / WIDTH
    # A pasted object is taught as an object of its class where it was drawn (the strict oracle).
    pasted = objective.objects(
        0, Composition.from_parameters({'insertion': 0.1, 'insertion_class': 1.0}), WIDTH, HEIGHT
    )
    assert len(pasted) == 3 and pasted[-1, 0] == 1 and pasted[-1, 5] == 1


@pytest.mark.parametrize('family', ['owlvit', 'owlv2'])
def test_a_detector_that_suppresses_duplicates_is_taught_every_patch_near_an_object(tiny_model_dirs, family):
    """A detector with its own suppression (as the demo detector, taught densely) is hardened densely:
    the patches around each required object answer it, an object the oracle does not require is taught
    nowhere; OWLv2's patches tile the frame padded to a square, so a wide frame uses the grid's top."""
    from metavlm_ros.training.objectives import _dense_targets, _taught_densely

    backend = create_backend('detector', str(tiny_model_dirs('detector', family=family)), nms_iou=0.5)
    assert _taught_densely(backend)
    assert not _taught_densely(create_backend('detector', str(tiny_model_dirs('detector', family=family))))
    frame = np.zeros((HEIGHT, WIDTH, 3), np.uint8)
    logits, _ = backend.detection_outputs([frame])
    grid = int(np.sqrt(logits.shape[1]))
    # The trash near the bottom left, required; the animal at the top right, not required.
    objects = np.array([[3, 0.2, 0.8, 0.3, 0.3, 1], [0, 0.8, 0.2, 0.2, 0.2, 0]], np.float32)
    classes, ignore, _, taught = _dense_targets([objects], [frame], logits.shape[1], backend)
    rows, cols = np.divmod(np.flatnonzero(classes[0] == 3), grid)
    assert len(rows) and (classes[0] >= 0).sum() == len(rows) and taught[0][classes[0] == 3].all()
    assert ignore[0].any() and not (ignore[0] & (classes[0] >= 0)).any()
    # Centre y 0.8 of the frame: row 0.8 of the grid (OWL-ViT), 0.8 x 36 / 48 = 0.6 of it (OWLv2).
    row = 0.8 * (HEIGHT / WIDTH if family == 'owlv2' else 1.0)
    assert np.abs((rows + 0.5) / grid - row).min() <= 0.5 / grid and ((cols + 0.5) / grid < 0.5).all()


def test_the_detection_loss_falls_when_the_model_is_trained_on_it(tiny_model_dirs):
    backend = create_backend(
        'detector', str(tiny_model_dirs('detector', family='owlvit')), score_threshold=0.05
    )
    rng = np.random.default_rng(3)
    frames = [rng.integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8) for _ in range(3)]
    teacher = backend.predict(frames)
    assert all(answer.detections for answer in teacher)
    objective = objective_for(backend, teacher)
    changes = [Composition.from_parameters({'translation': 0.03})] * 3
    followups = [np.roll(frame, 1, axis=1) for frame in frames]
    tuning = attach(backend.model, 'full')
    optimiser = torch.optim.Adam(tuning.trainable.values(), lr=3e-3)
    torch.manual_seed(0)
    losses = []
    for _ in range(15):
        loss = objective.loss(backend, followups, [0, 1, 2], changes)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(float(loss))
    assert np.isfinite(losses).all() and losses[-1] < 0.7 * losses[0], losses


@pytest.mark.parametrize(('family', 'method'), [('owlv2', 'lora'), ('grounding-dino', 'auto')])
def test_a_hardened_detector_saves_in_its_base_form(
    tiny_model_dirs, training_frames, tmp_path, family, method
):
    directory = tiny_model_dirs('detector', family=family)
    backend = create_backend('detector', str(directory), score_threshold=0.05)
    settings = HardenSettings(steps=2, batch=2, validation_followups=1, method=method, rank=2)
    done = harden(backend, training_frames[:6], PLAN, tmp_path / 'work', settings)
    assert done.method == ('lora' if family == 'owlv2' else 'full') and done.trainable_parameters > 0
    assert done.before.measure == 'detection F1 at IoU 0.5' and np.isfinite(done.losses).all()
    if family == 'owlv2':
        # The heads train in full beside the tower's adapters; the text tower never moves.
        assert any(name.startswith('class_head') for name in done_trainable(backend, settings))
    save_model(backend, tmp_path / 'model')
    again = create_backend('detector', str(tmp_path / 'model'), score_threshold=0.05)
    assert not any('lora' in k or 'modules_to_save' in k for k in again.model.state_dict())
    frames = [f.rgb for f in training_frames[:3]]
    for ours, theirs in zip(backend.predict(frames), again.predict(frames), strict=True):
        assert [d.cls for d in ours.detections] == [d.cls for d in theirs.detections]
        for a, b in zip(ours.detections, theirs.detections, strict=True):
            assert a.box == pytest.approx(b.box, abs=1e-3) and a.score == pytest.approx(b.score, abs=1e-5)


def done_trainable(backend, settings):
    """The names LoRA leaves trainable on a fresh copy of the same model (the hardened one is merged)."""
    fresh = create_backend('detector', backend.model_path, score_threshold=0.05)
    return attach(fresh.model, 'lora', rank=settings.rank).trainable


def test_peft_cannot_wrap_grounding_dino_so_lora_is_refused(tiny_model_dirs):
    backend = create_backend('detector', str(tiny_model_dirs('detector', family='grounding-dino')))
    assert choose_method(backend.model, 'auto') == 'full'
    with pytest.raises(ParameterError, match='peft cannot wrap grounding-dino'):
        choose_method(backend.model, 'lora')


def test_clean_accuracy_is_detection_f1_for_boxes_and_auc_needs_enough_frames():
    frames = [np.zeros((HEIGHT, WIDTH, 3), np.uint8)] * 2
    truth = [
        FrameTruth((False, False, False, True), (Detection('trash', 1.0, (10, 10, 20, 20)),)),
        FrameTruth((True, False, False, False), (Detection('animal', 1.0, (0, 0, 8, 8)),)),
    ]
    # One right box, one in the wrong place (IoU 0), one extra: 1 hit of 3 found and 2 there.
    answers = [
        _answer(Detection('trash', 0.9, (10, 10, 20, 20)), Detection('object', 0.4, (30, 5, 40, 15))),
        _answer(Detection('animal', 0.8, (30, 20, 40, 30))),
    ]
    measure, value = clean_accuracy(answers, truth, CLASSES, frames)
    assert measure == 'detection F1 at IoU 0.5' and value == pytest.approx(2 * 1 / (3 + 2))
    assert clean_accuracy(answers, [truth[0], None], CLASSES, frames)[1] is None
    # A presence AUC over fewer than 5 frames with and 5 without a class is not reported.
    scores = np.array([[0.9], [0.8], [0.2], [0.1]] * 3)
    present = np.array([[True], [True], [False], [False]] * 3)
    assert presence_auc(scores[:4], present[:4]) is None
    assert presence_auc(scores, present) == pytest.approx(1.0)
