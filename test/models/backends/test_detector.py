"""The open-vocabulary detectors (OWL-ViT, OWLv2, Grounding DINO, MM Grounding DINO) on tiny random models:
detections in the frame's pixels, batching, OWLv2's square padding, and a search through the CLI."""

import json

import cv2
import numpy as np
import pandas as pd
import pytest
import torch

from metavlm_ros.cli import main
from metavlm_ros.common.errors import ModelError
from metavlm_ros.common.results import read_jsonl, records_file
from metavlm_ros.models.backends.detector import FAMILIES, DetectorBackend, family_of, frame_boxes
from metavlm_ros.models.registry import resolve_options
from metavlm_ros.models.tiny_detectors import DETECTOR_FAMILIES
from test.conftest import make_frame

# Batched and one-by-one runs differ only by float32 summation order: scores by < 1e-6 (measured
# up to 8e-7 on Grounding DINO), boxes by less than a thousandth of a pixel.
SCORE_TOLERANCE = 1e-5
BOX_TOLERANCE = 1e-3


@pytest.fixture(scope='module')
def detector_dirs(tiny_model_dirs):
    return {family: tiny_model_dirs('detector', family=family) for family in DETECTOR_FAMILIES}


@pytest.fixture(scope='module')
def detectors(detector_dirs):
    """Each family's tiny detector on the CPU, every slot a detection (threshold 0)."""
    options = resolve_options('detector', {'device': 'cpu', 'score_threshold': 0.0})
    return {family: DetectorBackend(str(path), **options) for family, path in detector_dirs.items()}


@pytest.fixture(scope='module')
def frames():
    # Wider than tall: OWLv2 pads them, Grounding DINO keeps their aspect, OWL-ViT stretches them.
    return [make_frame(96, 48), make_frame(96, 48)[::-1].copy(), make_frame(96, 48)[:, ::-1].copy()]


def _array(prediction):
    return np.array([d.box for d in prediction.detections]).reshape(-1, 4)


@pytest.mark.parametrize('family', DETECTOR_FAMILIES)
def test_each_family_finds_objects_of_its_classes_inside_the_frame(detectors, frames, family):
    backend = detectors[family]
    assert backend.family_name == family and backend.kind == 'detection'
    for prediction in backend.predict(frames):
        assert prediction.kind == 'detection' and prediction.detections and not prediction.error
        boxes = _array(prediction)
        assert (boxes[:, 0] >= 0).all() and (boxes[:, 1] >= 0).all()
        assert (boxes[:, 2] <= 96).all() and (boxes[:, 3] <= 48).all()
        assert (boxes[:, 2] > boxes[:, 0]).all() and (boxes[:, 3] > boxes[:, 1]).all()
        assert {d.cls for d in prediction.detections} <= set(backend.classes)
        assert prediction.values == {
            c: float(sum(d.cls == c for d in prediction.detections)) for c in backend.classes
        }


@pytest.mark.parametrize('family', DETECTOR_FAMILIES)
def test_batches_answer_as_frames_one_by_one(detectors, frames, family):
    backend = detectors[family]
    backend.batch_size = 3
    batched = backend.predict(frames)
    backend.batch_size = 1
    try:
        alone = backend.predict(frames)
    finally:
        backend.batch_size = 3
    for together, single in zip(batched, alone, strict=True):
        assert [d.cls for d in together.detections] == [d.cls for d in single.detections]
        scores = np.array(
            [[a.score, b.score] for a, b in zip(together.detections, single.detections, strict=True)]
        )
        assert np.abs(scores[:, 0] - scores[:, 1]).max() < SCORE_TOLERANCE
        assert np.abs(_array(together) - _array(single)).max() < BOX_TOLERANCE


def test_owlv2_boxes_are_fractions_of_the_padded_square(detectors, frames):
    """OWLv2 sees a 96 x 48 frame padded to 96 x 96 at the bottom: its box fractions scale by 96 on both
    axes. Padding the frame by hand gives the model the same pixels, so the same boxes, which
    clipped to the frame are the unpadded frame's; and transformers' own post-processing agrees."""
    backend = detectors['owlv2']
    frame = frames[0]
    padded = np.zeros((96, 96, 3), np.uint8)
    padded[:48] = frame
    (plain,) = backend.predict([frame])
    (square,) = backend.predict([padded])
    clipped = [
        (d.cls, d.score, (x1, y1, x2, min(y2, 48.0)))
        for d in square.detections
        for x1, y1, x2, y2 in [d.box]
        if y1 < 48.0
    ]
    assert [(c, s) for c, s, _ in clipped] == [(d.cls, d.score) for d in plain.detections]
    assert np.allclose([b for *_, b in clipped], _array(plain), atol=1e-4)
    # Some objects lie wholly in the padding: they are not the frame's.
    assert len(square.detections) > len(plain.detections)

    with torch.inference_mode():
        text = {k: v.repeat(1, 1) for k, v in backend._text.items()}
        outputs = backend.model(**text, **backend.image_inputs([frame]))
        (theirs,) = backend.processor.post_process_grounded_object_detection(
            outputs, threshold=0.0, target_sizes=[(48, 96)]
        )
    limit = torch.tensor([96.0, 48.0, 96.0, 48.0])
    expected = torch.minimum(theirs['boxes'].clamp(min=0), limit)
    assert torch.allclose(frame_boxes(outputs.pred_boxes, [(48, 96)], square=True)[0], expected, atol=1e-4)
    stretched = frame_boxes(outputs.pred_boxes, [(48, 96)], square=False)[0]
    assert not torch.allclose(stretched, expected, atol=1.0)  # the frame's own height would be wrong


def test_owlvit_boxes_match_transformers_post_processing(detectors, frames):
    backend = detectors['owlvit']
    with torch.inference_mode():
        text = {k: v.repeat(1, 1) for k, v in backend._text.items()}
        outputs = backend.model(**text, **backend.image_inputs(frames[:1]))
        (theirs,) = backend.processor.post_process_grounded_object_detection(
            outputs, threshold=0.0, target_sizes=[(48, 96)]
        )
    (ours,) = backend.predict(frames[:1])
    order = theirs['scores'].argsort(descending=True)
    limit = torch.tensor([96.0, 48.0, 96.0, 48.0])
    expected = torch.minimum(theirs['boxes'][order].clamp(min=0), limit)
    assert np.allclose(_array(ours), expected.numpy(), atol=1e-4)
    assert [d.cls for d in ours.detections] == [backend.classes[i] for i in theirs['labels'][order]]


#: Frames the pixel scores are checked on, by family: OWLv2's path is its processor's steps to float32
#: rounding at any size (a wide frame: padded, then shrunk); OWL-ViT's and Grounding DINO's resize
#: follows PIL within its 8-bit rounding (test/models/test_detector_pixels.py), so they are checked on
#: frames their processors do not resize, where the model sees the same pixels.
PIXEL_FRAMES = {
    'owlvit': (32, 32),
    'owlv2': (96, 48),
    'grounding-dino': (128, 64),
    'mm-grounding-dino': (128, 64),
}
#: float32 summation order through the models (as batches and frames one by one differ).
PIXEL_TOLERANCE = 1e-4


@pytest.mark.parametrize(
    ('family', 'nms'), [*((f, None) for f in DETECTOR_FAMILIES), ('owlvit', 0.1), ('owlv2', 0.1)]
)
def test_pixel_scores_are_each_class_sum_of_its_detection_scores(detectors, family, nms):
    """What occlusion reads from predict for a detection (the sum of the class's detection scores), from
    the pixels with gradients: the same slots kept (above the threshold, with area in the frame, not
    suppressed where the detector suppresses duplicates)."""
    backend = detectors[family]
    backend.nms_iou = nms
    frame = make_frame(*PIXEL_FRAMES[family], seed=5)
    pixels = torch.from_numpy(frame).permute(2, 0, 1)[None].float().requires_grad_()
    # A threshold at the slots' median score: some slots are detections, some not.
    (every,) = backend.predict([frame])
    # (With suppression, a fifth below it: more detections, some overlapping.)
    threshold = float(np.quantile([d.score for d in every.detections], 0.5 if nms is None else 0.2))
    backend.score_threshold = threshold
    try:
        (prediction,) = backend.predict([frame])
        scores = backend.pixel_scores(pixels)
        backend.nms_iou = None
        (unsuppressed,) = backend.predict([frame])
    finally:
        backend.score_threshold, backend.nms_iou = 0.0, None
    assert 0 < len(prediction.detections) < len(every.detections)
    # With suppression, fewer of the same slots (the sums below then hold only if pixel_scores drops them).
    assert (len(prediction.detections) < len(unsuppressed.detections)) == (nms is not None)
    expected = [sum(d.score for d in prediction.detections if d.cls == c) for c in backend.classes]
    assert scores.shape == (1, len(backend.classes))
    assert scores[0].tolist() == pytest.approx(expected, rel=PIXEL_TOLERANCE, abs=PIXEL_TOLERANCE)
    scores.sum().backward()
    assert torch.isfinite(pixels.grad).all() and pixels.grad.abs().max() > 0
    if family == 'owlv2':  # 16 slots; those whose box lies wholly in the padding are no detections
        assert len(every.detections) < 16


def test_the_family_comes_from_the_config_with_its_threshold(detector_dirs, tmp_path):
    for family, path in detector_dirs.items():
        options = resolve_options('detector', {})
        described = DetectorBackend.describe(str(path), options)
        assert described['family'] == family
        assert described['score_threshold'] == FAMILIES[family].threshold
    (tmp_path / 'config.json').write_text(json.dumps({'model_type': 'clip'}))
    with pytest.raises(ModelError, match='not an open-vocabulary detector'):
        family_of(str(tmp_path))
    backend = DetectorBackend(
        str(detector_dirs['owlv2']), **resolve_options('detector', {'device': 'cpu', 'score_threshold': 0.55})
    )
    (prediction,) = backend.predict([make_frame(96, 48)])
    assert backend.score_threshold == 0.55 and all(d.score > 0.55 for d in prediction.detections)


def test_non_maximum_suppression_keeps_each_class_best_of_overlapping_boxes(
    detectors, detector_dirs, frames, tmp_path
):
    """nms_iou: of two detections of a class overlapping above it, the lower-scoring is dropped, and
    nothing else; a model may name its own in config.json (as the demo detector does)."""
    import shutil

    from torchvision.ops import box_iou

    every = detectors['owlvit'].predict(frames)  # threshold 0, no suppression: every slot
    own = tmp_path / 'owlvit'
    shutil.copytree(detector_dirs['owlvit'], own)
    config = json.loads((own / 'config.json').read_text())
    (own / 'config.json').write_text(json.dumps({**config, 'nms_iou': 0.3}))
    options = resolve_options('detector', {'device': 'cpu', 'score_threshold': 0.0})
    named = DetectorBackend(str(own), **options)
    assert named.nms_iou == 0.3 and DetectorBackend.describe(str(own), options)['nms_iou'] == 0.3
    assert DetectorBackend.describe(str(detector_dirs['owlvit']), options)['nms_iou'] is None
    suppressed = 0
    for whole, kept in zip(every, named.predict(frames), strict=True):
        assert set(kept.detections) <= set(whole.detections)
        assert kept.values == {c: float(sum(d.cls == c for d in kept.detections)) for c in named.classes}
        for cls in named.classes:
            mine = [d for d in kept.detections if d.cls == cls]
            overlap = box_iou(
                torch.tensor([d.box for d in mine]).reshape(-1, 4),
                torch.tensor([d.box for d in whole.detections if d.cls == cls]).reshape(-1, 4),
            )
            pairwise = box_iou(*[torch.tensor([d.box for d in mine]).reshape(-1, 4)] * 2)
            assert (pairwise.fill_diagonal_(0) <= 0.3).all()
            for j, dropped in enumerate(d for d in whole.detections if d.cls == cls):
                if dropped in mine:
                    continue
                suppressed += 1
                assert any(overlap[i, j] > 0.3 and d.score >= dropped.score for i, d in enumerate(mine))
    assert suppressed > 0
    # Given as an option, it wins over the model's own: at IoU 1 nothing is suppressed.
    unsuppressed = DetectorBackend(str(own), **{**options, 'nms_iou': 1.0}).predict(frames)
    assert [p.detections for p in unsuppressed] == [p.detections for p in every]


def test_grounding_dino_reads_each_class_from_its_phrase(detectors):
    backend = detectors['grounding-dino']
    tokenizer = backend.processor.tokenizer
    tokens = tokenizer.convert_ids_to_tokens(backend._text['input_ids'][0])
    for cls, row in zip(backend.classes, backend._owner, strict=True):
        owned = [t for t, mine in zip(tokens, row, strict=True) if mine]
        assert owned == tokenizer.tokenize(backend.class_prompts[cls])
    assert tokens[0] == '[CLS]' and tokens.count('.') == len(backend.classes)


def test_search_command_writes_detection_records_pandas_reads(detector_dirs, tmp_path, capsys):
    image = tmp_path / 'frame.png'
    cv2.imwrite(str(image), make_frame(96, 64)[..., ::-1])
    out = tmp_path / 'res'
    code = main(
        [
            'search', '--backend', 'detector', '--model', str(detector_dirs['owlv2']), str(image),
            '--out', str(out), '--evaluations', '20', '--population', '10', '--device', 'cpu', '--quiet',
        ]
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    records = read_jsonl(out / 'evaluations.jsonl')
    assert len(records) == 20 and {r['kind'] for r in records} == {'detection'}
    table = pd.read_json(records_file(out / 'evaluations.jsonl'), lines=True)
    judged = table[~table['failed'] & (table['order'] > 0)]
    assert len(judged) and all(isinstance(found, list) for found in judged['followup_detections'])
    assert all(boxes for boxes in judged['boxes'])
    first = next(d for found in judged['followup_detections'] for d in found)
    assert set(first) == {'class', 'score', 'box'} and len(first['box']) == 4
