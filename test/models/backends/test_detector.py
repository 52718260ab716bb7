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
from metavlm_ros.models.tiny import build_tiny_model
from metavlm_ros.models.tiny_detectors import DETECTOR_FAMILIES
from test.conftest import make_frame

# Batched and one-by-one runs differ only by float32 summation order: scores by < 1e-6 (measured
# up to 8e-7 on Grounding DINO), boxes by less than a thousandth of a pixel.
SCORE_TOLERANCE = 1e-5
BOX_TOLERANCE = 1e-3


@pytest.fixture(scope='module')
def detector_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp('tiny-detectors')
    return {
        family: build_tiny_model('detector', root / family, family=family) for family in DETECTOR_FAMILIES
    }


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
