"""Tests of the demo detector: the shipped model on fresh frames, its recipe's parts, and its trainer."""

import json
from pathlib import Path

import numpy as np
import pytest

import metavlm_ros
from metavlm_ros.demo.config import TrainingConfig
from metavlm_ros.demo.evaluation import detection_accuracy, robustness
from metavlm_ros.demo.scenes import SceneSet, render_scenes
from metavlm_ros.method.answers import iou_key
from metavlm_ros.method.prediction import CLASSES, Prediction
from metavlm_ros.models.vlm import create_backend, resolve_model

MODELS = Path(metavlm_ros.__file__).resolve().parent / 'models'
#: Scenes of no training set and not the held-out set the recipe was tuned on (bench/demo_detector.py
#: measures from 950000 on; these are others again).
FRESH_SEED = 970_000


@pytest.fixture(scope='module')
def fresh():
    # Six frames of six scenes (pool, shallow and deep twice), 384x216 as the held-out set.
    return render_scenes(6, FRESH_SEED, frames_per_scene=1, sizes=((384, 216),), keep_frames=True)


@pytest.fixture(scope='module')
def detector():
    return create_backend('detector', 'demo', device='cpu')


def test_shipped_detector_directory_is_complete_small_and_an_owl_vit():
    directory = MODELS / 'demo-detector'
    assert resolve_model('detector', 'demo') == str(directory)
    for name in ('config.json', 'model.safetensors', 'tokenizer.json', 'processor_config.json', 'README.md'):
        assert (directory / name).is_file(), name
    assert json.loads((directory / 'config.json').read_text())['model_type'] == 'owlvit'
    assert (directory / 'model.safetensors').stat().st_size <= 10 * 1024 * 1024
    assert not list(directory.glob('*.bin')), 'weights must be safetensors only'
    card = (directory / 'README.md').read_text()
    assert 'demonstration only' in card and 'metavlm train-demo-models --models detector' in card
    figures = json.loads((directory / 'training.json').read_text())['heldout']
    assert figures['accuracy']['precision'] > 0 and figures['robustness']['rate_by_f_trans']


def test_demo_detector_finds_half_the_true_boxes_and_most_of_its_boxes_are_right_on_fresh_frames(
    detector, fresh
):
    # Its card's held-out figures: precision 0.64, recall 0.51 (300 frames); these 6 frames' 36 objects
    # gave 0.59 and 0.47: bounds a few objects below them.
    accuracy = detection_accuracy(detector, fresh)
    assert accuracy['objects'] >= 20
    assert accuracy['recall'] >= 0.4, accuracy
    assert accuracy['precision'] >= 0.5, accuracy


def test_demo_detector_answers_the_same_frames_identically(detector, fresh):
    first, second = detector.predict(fresh.frames[:3]), detector.predict(fresh.frames[:3])
    assert [p.detections for p in first] == [p.detections for p in second]
    assert any(p.detections for p in first)


def test_demo_detector_is_steadier_under_small_changes_than_under_large_ones(detector, fresh):
    figures = robustness(detector, fresh.frames[:3], evaluations=60, seed=1)
    key = iou_key(0.5)
    rates, counts = figures['rate_by_f_trans'][key], figures['evaluations_by_f_trans'][key]
    small = sum(rates[b] * counts[b] for b in ('0', '0.25') if b in counts) / sum(
        counts.get(b, 0) for b in ('0', '0.25')
    )
    large = sum(rates[b] * counts[b] for b in ('2',) if b in counts) / counts['2']
    assert small < large, (rates, counts)


class _Truth:
    """A detector double that answers each frame's true boxes (the SceneSet's), less `drop`'s class."""

    kind = 'detection'

    def __init__(self, scenes: SceneSet, drop: str | None = None) -> None:
        self.scenes, self.drop = scenes, drop

    def predict(self, frames):
        from metavlm_ros.method.boxes import Detection

        answers = []
        for frame in frames:
            index = next(i for i, f in enumerate(self.scenes.frames) if f is frame)
            height, width = frame.shape[:2]
            found = tuple(
                Detection(CLASSES[int(r[0])], 0.9, tuple(r[1:5] * [width, height, width, height]))
                for r in self.scenes.boxes[index]
                if CLASSES[int(r[0])] != self.drop
            )
            answers.append(Prediction('detection', {}, detections=found))
        return answers


def test_detection_accuracy_counts_what_is_found_against_the_true_boxes(fresh):
    perfect = detection_accuracy(_Truth(fresh), fresh)
    assert perfect['precision'] == perfect['recall'] == perfect['frames_correct'] == 1.0
    assert perfect['objects'] == perfect['found'] == sum(len(b) for b in fresh.boxes)
    blind = detection_accuracy(_Truth(fresh, drop='trash'), fresh)
    trash = sum(int((b[:, 0] == CLASSES.index('trash')).sum()) for b in fresh.boxes)
    assert blind['precision'] == 1.0 and blind['per_class']['trash']['recall'] == 0.0
    assert blind['recall'] == pytest.approx(1 - trash / perfect['objects'])
    assert blind['frames_correct'] < 1.0


def test_objects_and_patches_are_matched_one_to_one_near_each_objects_centre():
    from metavlm_ros.demo.train_detector import box_targets

    # A 4x4 patch grid. Two objects centred in patch (row 1, col 1), the animal on its centre: matched by
    # distance, the animal keeps it and the trash goes to the free neighbour nearest its centre (left of
    # it); a speck leaves its patch untaught.
    rows = np.array(
        [
            [0, 0.30, 0.30, 0.45, 0.45, 0.02],  # animal, centre (0.375, 0.375): patch (1, 1)'s centre
            [3, 0.26, 0.35, 0.48, 0.40, 0.01],  # trash, centre (0.37, 0.375)
            [1, 0.80, 0.80, 0.81, 0.81, 1e-5],  # vegetation speck in patch (3, 3)
        ],
        np.float32,
    )
    classes, ignore, boxes = box_targets([rows], grid=4, min_area=1e-4)
    grid = classes[0].reshape(4, 4)
    assert grid[1, 1] == 0 and grid[1, 0] == 3 and (grid >= 0).sum() == 2
    assert ignore[0].reshape(4, 4)[3, 3] and ignore[0].sum() == 1
    assert boxes[0, 1 * 4 + 1] == pytest.approx([0.375, 0.375, 0.15, 0.15])
    assert boxes[0, 1 * 4 + 0] == pytest.approx([0.37, 0.375, 0.22, 0.05])
    # Matched by what the patches answer (DETR's cost): the patch whose box is the trash's takes it,
    # though another patch is nearer, and the animal goes to the one answering the animal.
    probabilities = np.full((1, 16, 4), 0.1)
    answered = np.tile([0.5, 0.5, 0.1, 0.1], (1, 16, 1)).astype(np.float32)
    answered[0, 1 * 4 + 2] = [0.37, 0.375, 0.22, 0.05]
    answered[0, 0 * 4 + 1] = [0.375, 0.375, 0.15, 0.15]
    classes, _, _ = box_targets([rows], grid=4, min_area=1e-4, predicted=(probabilities, answered))
    grid = classes[0].reshape(4, 4)
    assert grid[1, 2] == 3 and grid[0, 1] == 0 and (grid >= 0).sum() == 2


def test_dense_targets_teach_every_patch_near_an_object_and_its_box_around_it():
    from metavlm_ros.training.detection_loss import dense_box_targets

    # An 8x8 grid (patch centres at 0.0625 + k/8). The trash, centre (0.5, 0.4375) and half-sides
    # (0.25, 0.1875), is answered by the patches whose centres lie within a quarter of its sides
    # (0.125, and 0.75 patch = 0.094 on y): row 3, columns 3 and 4. Its box is taught in the ring within
    # half its sides plus half a patch: columns 1-6, rows 1-5.
    trash = [3, 0.25, 0.25, 0.75, 0.625, 0.1875]
    # Below min_area: the four patches within 0.75 patch of its centre (0.1025, 0.9025) untaught.
    speck = [1, 0.10, 0.90, 0.105, 0.905, 1e-5]
    classes, ignore, boxes, taught = dense_box_targets([np.array([trash, speck], np.float32)], 8, 1e-4)
    grid, ring = classes[0].reshape(8, 8), taught[0].reshape(8, 8)
    assert set(zip(*np.nonzero(grid >= 0), strict=True)) == {(3, 3), (3, 4)} and (grid[grid >= 0] == 3).all()
    assert ring[1:6, 1:7].all() and ring.sum() == 30
    assert boxes[0][taught[0]] == pytest.approx(np.tile([0.5, 0.4375, 0.5, 0.375], (30, 1)))
    assert set(zip(*np.nonzero(ignore[0].reshape(8, 8)), strict=True)) == {(6, 0), (6, 1), (7, 0), (7, 1)}
    assert not ring[6:, :2].any()

    # An object at the trash's centre, smaller: it answers those two patches (the smaller first), and
    # the trash keeps one, the free patch nearest its centre; each answering patch is taught its own
    # object's box, the ring the box of the smallest object around it.
    inner = [2, 0.45, 0.40, 0.55, 0.475, 0.0075]
    classes, _, boxes, taught = dense_box_targets([np.array([trash, inner], np.float32)], 8, 1e-4)
    grid = classes[0].reshape(8, 8)
    assert grid[3, 3] == grid[3, 4] == 2 and (grid == 3).sum() == 1
    row, col = np.argwhere(grid == 3)[0]
    assert abs(row - 3) == 1 and col in (3, 4)
    assert boxes[0, row * 8 + col] == pytest.approx([0.5, 0.4375, 0.5, 0.375])
    assert boxes[0, 3 * 8 + 3] == pytest.approx([0.5, 0.4375, 0.1, 0.075])
    assert taught[0][classes[0] >= 0].all()
    small_ring = taught[0].reshape(8, 8) & np.isclose(boxes[0, :, 2].reshape(8, 8), 0.1)
    assert small_ring[2:5, 2:6].sum() == small_ring.sum() == 11  # its 12 minus the trash's patch
    # More objects than patches (a tiny model's 2x2 grid), smallest first: each patch answers one of the
    # four smaller (classes 1, 2, 3, 1), and the largest (class 0) is left untaught.
    crowd = np.array([[k, 0.1 * c, 0.1 * c, 0.1 * c + 0.05 * (c + 1), 0.1 * c + 0.05 * (c + 1), 0.1]
                      for c, k in enumerate((1, 2, 3, 1, 0))], np.float32)  # fmt: skip
    classes, _, _, _ = dense_box_targets([crowd], 2, 1e-4)
    assert sorted(classes[0]) == [1, 1, 2, 3]


def test_calibration_keeps_the_most_precise_of_the_shifts_as_good_as_the_best(monkeypatch):
    """The logit shift with the best F1, or a more precise one within CALIBRATION_F1_SLACK of it (false
    detections are what small changes move across the threshold); the model keeps the shift chosen."""
    import types

    import torch

    from metavlm_ros.demo import evaluation
    from metavlm_ros.demo.train_detector import CALIBRATION_F1_SLACK, calibrate

    bias = torch.nn.Parameter(torch.tensor([0.5]))
    head = types.SimpleNamespace(logit_shift=types.SimpleNamespace(bias=bias))
    backend = types.SimpleNamespace(model=types.SimpleNamespace(class_head=head))
    # precision, recall by shift: F1 0.700 at 0.0, 0.6955 at -0.1 (more precise, within the slack),
    # 0.667 at -0.2 (most precise, too far below).
    table = {0.0: (0.70, 0.70), -0.1: (0.80, 0.615), -0.2: (0.90, 0.53)}
    asked = []

    def accuracy(model, scenes):
        shift = round(float(model.model.class_head.logit_shift.bias.item()) - 0.5, 3)
        asked.append(shift)
        precision, recall = table[shift]
        return {'precision': precision, 'recall': recall}

    monkeypatch.setattr(evaluation, 'detection_accuracy', accuracy)
    chosen = calibrate(backend, scenes=None, shifts=tuple(table))
    assert asked == list(table) and 0.700 - 0.6955 < CALIBRATION_F1_SLACK < 0.700 - 0.667
    assert chosen['shift'] == -0.1 and chosen['f1'] == pytest.approx(2 * 0.8 * 0.615 / 1.415)
    assert bias.item() == pytest.approx(0.4)


def test_augmented_boxes_move_with_the_pixels():
    from metavlm_ros.demo.train_detector import detection_batch

    # A white box on black: wherever the relations move it, its taught box follows (or it is ignored).
    mid = np.zeros((1, 72, 128, 3), np.uint8)
    mid[0, 24:48, 48:80] = 255
    rows = np.array([[2, 48 / 128, 24 / 72, 80 / 128, 48 / 72, 0.08]], np.float32)
    scenes = SceneSet(
        [], np.zeros((1, 64, 64, 3), np.uint8), np.zeros((1, 4), int), [''], mid=mid, boxes=[rows]
    )
    config = TrainingConfig(image_size=64, detector_augment=1.0, detector_augment_magnitude=1.0)
    rng = np.random.default_rng(3)
    moved = 0
    for _ in range(30):
        small, taught = detection_batch(scenes, np.array([0]), rng, config)
        (row,) = taught[0]
        if row[5] < 0:
            continue  # left mostly outside the frame: neither object nor background
        white = np.argwhere(small[0, :, :, 0] > 127)
        x0, y0 = white[:, 1].min() / 64, white[:, 0].min() / 64
        x1, y1 = (white[:, 1].max() + 1) / 64, (white[:, 0].max() + 1) / 64
        assert row[1:5] == pytest.approx([x0, y0, x1, y1], abs=3 / 64)
        moved += not np.allclose(row[1:5], rows[0, 1:5], atol=1e-3)
    assert moved >= 10


def test_owl_layout_keeps_the_clips_tokens_and_its_text_tower():
    import torch
    from transformers import CLIPModel, CLIPProcessor

    from metavlm_ros.demo.train_detector import OWL_TEXT_LENGTH, detector_outputs, owl_from_clip

    clip_dir = MODELS / 'demo-clip'
    model, tokenizer = owl_from_clip(clip_dir, seed=0)
    clip = CLIPModel.from_pretrained(clip_dir, local_files_only=True, use_safetensors=True)
    before = CLIPProcessor.from_pretrained(clip_dir, local_files_only=True).tokenizer
    prompt = 'a photo of trash underwater'
    ids = tokenizer(prompt, padding='max_length', max_length=OWL_TEXT_LENGTH, return_tensors='pt')
    # OWL's layout: the first id is not 0 (not padding), the end of text is the largest id (pooled).
    assert ids['input_ids'][0, 0] > 0 and ids['input_ids'].argmax() == (ids['attention_mask'][0].sum() - 1)
    assert tokenizer.convert_ids_to_tokens(ids['input_ids'][0])[: ids['attention_mask'].sum()] == (
        before.convert_ids_to_tokens(before(prompt)['input_ids'])
    )
    with torch.no_grad():
        mine = model.owlvit.get_text_features(**ids).pooler_output
        theirs = clip.get_text_features(**before([prompt], return_tensors='pt')).pooler_output
        assert torch.allclose(mine, theirs, atol=1e-5)
        # The trainer's forward (queries embedded once per batch) is the model's own.
        pixels = torch.randn(2, 3, 128, 128, generator=torch.Generator().manual_seed(0))
        queries = tokenizer(
            ['a photo of an animal underwater', prompt],
            padding='max_length',
            max_length=16,
            return_tensors='pt',
        )
        logits, boxes = detector_outputs(model, queries, pixels)
        output = model(
            input_ids=queries['input_ids'].repeat(2, 1),
            attention_mask=queries['attention_mask'].repeat(2, 1),
            pixel_values=pixels,
        )
    assert torch.allclose(logits, output.logits, atol=1e-4) and torch.equal(boxes, output.pred_boxes)


def _tiny(**changes) -> TrainingConfig:
    """The detector recipe at toy size (seconds)."""
    toy = dict(
        detector_train_frames=4,
        detector_frames_per_scene=2,
        heldout_frames=3,
        detector_steps=3,
        detector_batch_size=2,
        workers=1,
        robustness_evaluations=0,
    )
    return TrainingConfig(**(toy | changes))


def test_a_tiny_detector_training_is_seeded_and_saves_a_detector_the_backend_loads(tmp_path):
    from metavlm_ros.demo.training import train_demo_models, write_model_card

    config = _tiny(robustness_evaluations=6, robustness_frames=1)
    lines = []
    summary = train_demo_models(
        tmp_path / 'a', config, cache=tmp_path / 'cache', log=lines.append, models=['detector']
    )
    train_demo_models(
        tmp_path / 'b', config, cache=tmp_path / 'cache', log=lambda line: None, models=['detector']
    )
    weights = [(tmp_path / run / 'demo-detector' / 'model.safetensors').read_bytes() for run in ('a', 'b')]
    assert weights[0] == weights[1]
    other = train_demo_models(
        tmp_path / 'c', _tiny(seed=1), cache=tmp_path / 'cache', log=lambda line: None, models=['detector']
    )
    assert (tmp_path / 'c' / 'demo-detector' / 'model.safetensors').read_bytes() != weights[0]
    # The shipped CLIP it started from, named inside the package: no path of the machine that trained it.
    assert other['detector']['clip_from'] == 'metavlm_ros/models/demo-clip'
    assert Path(resolve_model('clip', 'demo')).resolve().parts[-3:] == ('metavlm_ros', 'models', 'demo-clip')
    directory = tmp_path / 'a' / 'demo-detector'
    backend = create_backend('detector', str(directory), device='cpu')
    assert backend.kind == 'detection' and backend.family_name == 'owlvit'
    assert any(line.startswith('detector held-out precision') for line in lines)
    robust = 'detector robustness (Rand, 6 evaluations x 1 held-out frames), objects at IoU 0.5'
    assert any(line.startswith(robust) for line in lines)
    card = write_model_card(directory, 'detector', summary).read_text()
    assert '--models detector --seed 0 --detector-train-frames 4' in card and '## Robustness' in card
    # Taught densely (the default): the saved detector names its own suppression, and loads with it.
    assert backend.nms_iou == json.loads((directory / 'config.json').read_text())['nms_iou'] == 0.5
    assert 'non-maximum suppression at IoU 0.5' in card


def test_the_cards_command_sets_what_the_recipe_did():
    import argparse

    from metavlm_ros.commands import train_demo_models
    from metavlm_ros.demo.detector_card import detector_command

    config = TrainingConfig(
        seed=3,
        detector_steps=7,
        detector_lr=0.002,
        detector_augment=0.25,
        detector_targets='matched',
        detector_nms_iou=0.3,
    )
    words = detector_command(vars(config)).split()
    assert words[:3] == ['metavlm', 'train-demo-models', '--models']
    parser = argparse.ArgumentParser()
    train_demo_models.add_parser(parser.add_subparsers())
    args = parser.parse_args(words[1:])
    assert args.seed == 3 and args.detector_steps == 7 and args.detector_lr == 0.002
    assert args.detector_augment == 0.25 and args.models == 'detector'
    assert (args.detector_targets, args.detector_nms_iou) == ('matched', 0.3)
