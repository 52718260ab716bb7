"""Grounding answers read as detections: each family's format, by hand-written answers, to frame pixels."""

import json

import pytest

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.method.boxes import Detection
from metavlm_ros.method.prediction import CLASSES
from metavlm_ros.models.counts import label_matcher
from metavlm_ros.models.grounding import (
    BOX_FORMATS,
    RELEASED_QWEN_RESIZE,
    QwenResize,
    box_format_for,
    detection_prediction,
    family_of_model_id,
    grounding_question,
    grounding_questions,
    parse_grounding,
)

MATCH = label_matcher(CLASSES)


def _qwen(*objects) -> str:
    return json.dumps([{'bbox_2d': list(box), 'label': label} for label, box in objects])


def _read(text, box_format, size, resize=RELEASED_QWEN_RESIZE):
    prediction = detection_prediction(text, box_format, size, CLASSES, MATCH, resize)
    assert not prediction.error, prediction.error
    return prediction


@pytest.mark.parametrize(
    ('width', 'height', 'resize'),
    [
        (640, 480, RELEASED_QWEN_RESIZE),
        (1920, 1080, RELEASED_QWEN_RESIZE),
        (4000, 3000, RELEASED_QWEN_RESIZE),  # above max_pixels: scaled down
        (30, 20, RELEASED_QWEN_RESIZE),  # below min_pixels: scaled up
        (1000, 500, QwenResize(28, 3136, 28 * 28 * 100)),
        (64, 48, QwenResize(8, 256, 2304)),
        (123, 77, QwenResize(32, 1024, 16384)),  # Qwen3-VL's factor
    ],
)
def test_qwen_resize_is_transformers_smart_resize(width, height, resize):
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

    h_bar, w_bar = smart_resize(height, width, resize.factor, resize.min_pixels, resize.max_pixels)
    assert resize.size(width, height) == (w_bar, h_bar)


def test_qwen2_5_boxes_are_scaled_from_the_resized_input_to_the_frame():
    resize = QwenResize(28, 3136, 28 * 28 * 100)
    assert resize.size(1000, 500) == (392, 196)  # the processor shrank the frame 2.55 x
    text = _qwen(('plastic bottle', [39.2, 19.6, 196, 98]), ('fish', [0, 98, 392, 196]))
    prediction = _read(text, 'qwen2.5', (1000, 500), resize)
    assert prediction.detections == (
        Detection('trash', 1.0, pytest.approx((100.0, 50.0, 500.0, 250.0))),
        Detection('animal', 1.0, pytest.approx((0.0, 250.0, 1000.0, 500.0))),
    )
    assert prediction.values == {'animal': 1.0, 'vegetation': 0.0, 'object': 0.0, 'trash': 1.0}
    assert prediction.text == text and prediction.kind == 'detection'


def test_qwen2_5_served_frames_assume_the_released_processor():
    # 640 x 480 -> 644 x 476 (multiples of 28): boxes move by under 1 %, but they move.
    (found,) = _read(_qwen(('trash', [322, 238, 644, 476])), 'qwen2.5', (640, 480)).detections
    assert found.box == pytest.approx((320.0, 240.0, 640.0, 480.0))


def test_qwen3_boxes_are_on_a_0_to_1000_grid():
    text = '```json\n' + _qwen(('seaweed', [100, 250, 500, 750])) + '\n```'
    (found,) = _read(text, 'qwen3', (640, 480)).detections
    assert found == Detection('vegetation', 1.0, pytest.approx((64.0, 120.0, 320.0, 360.0)))


def test_paligemma_loc_tokens_are_y_first_bins_of_1024():
    text = '<loc0256><loc0128><loc0768><loc0512> trash ; <loc0000><loc0000><loc1023><loc1023> two fish'
    prediction = _read(text, 'paligemma', (1024, 512))
    assert prediction.detections == (
        Detection('trash', 1.0, (128.0, 128.0, 512.0, 384.0)),
        Detection('animal', 1.0, pytest.approx((0.0, 0.0, 1023.0, 511.5))),
    )
    assert _read('', 'paligemma', (64, 48)).values == dict.fromkeys(CLASSES, 0.0)  # found nothing


def test_florence2_detection_task_is_x_first_bin_centres_of_1000():
    text = (
        '</s><s>bottle<loc_100><loc_200><loc_300><loc_400>'
        'fish<loc_0><loc_0><loc_999><loc_999><loc_10><loc_10><loc_20><loc_20></s>'
    )
    prediction = _read(text, 'florence2', (1000, 500))
    assert prediction.detections == (
        Detection('trash', 1.0, pytest.approx((100.5, 100.25, 300.5, 200.25))),
        Detection('animal', 1.0, pytest.approx((0.5, 0.25, 999.5, 499.75))),
        Detection('animal', 1.0, pytest.approx((10.5, 5.25, 20.5, 10.25))),
    )


def test_answers_to_per_class_questions_are_read_each_on_its_own():
    answers = ['', 'fish<loc_0><loc_0><loc_499><loc_499>', 'trash<loc_500><loc_500><loc_999><loc_999>']
    prediction = _read(answers, 'florence2', (100, 100))
    assert [d.cls for d in prediction.detections] == ['animal', 'trash']
    assert prediction.text == '\n'.join(answers)  # one answer a line, in question order
    # One answer that does not parse fails the frame, even where the others joined would read as boxes.
    answers[0] = 'a bottle'
    failed = detection_prediction(answers, 'florence2', (100, 100), CLASSES, MATCH)
    assert failed.error.startswith("unparseable answer: answer 0: 'a bottle' is not label<loc_X>")
    assert failed.values == {} and failed.detections == () and failed.text == '\n'.join(answers)


def test_boxes_past_the_border_are_clipped_to_the_frame():
    (found,) = _read(_qwen(('crab', [-50, 900, 400, 1200])), 'qwen3', (100, 100)).detections
    assert found.box == pytest.approx((0.0, 90.0, 40.0, 100.0))


def test_labels_are_matched_to_classes_by_name_and_vocabulary_and_others_left_out():
    text = _qwen(
        ('Trash', [0, 0, 10, 10]),
        ('fish net', [0, 0, 10, 10]),  # the head noun decides: a net is trash
        ('sea turtles', [0, 0, 10, 10]),
        ('rock', [0, 0, 10, 10]),  # no class: left out, kept in the text
        ('tyres', [0, 0, 10, 10]),
    )
    default = _read(text, 'qwen3', (100, 100))
    assert [d.cls for d in default.detections] == ['trash', 'trash', 'animal', 'trash']
    assert 'rock' in default.text
    own = label_matcher(['litter', 'life'], {'litter': ['tyre', 'net'], 'life': ['turtle']})
    custom = detection_prediction(text, 'qwen3', (100, 100), ['litter', 'life'], own)
    assert [d.cls for d in custom.detections] == ['litter', 'life', 'litter']  # 'Trash' names no class now
    assert custom.values == {'litter': 2.0, 'life': 1.0}


def test_an_empty_list_is_no_objects_and_an_empty_answer_is_not():
    assert _read('[]', 'qwen2.5', (64, 48)).values == dict.fromkeys(CLASSES, 0.0)
    failed = detection_prediction('', 'qwen2.5', (64, 48), CLASSES, MATCH)
    assert failed.error.startswith('unparseable answer: not JSON') and failed.values == {}


@pytest.mark.parametrize(
    ('box_format', 'text', 'reason'),
    [
        ('qwen2.5', 'I see two fish and a bottle.', 'not JSON'),
        ('qwen2.5', '[{"bbox_2d": [1, 2, 30, 40], "label": "fish"}, {"bbox_2d": [5, ', 'not JSON'),  # cut
        ('qwen2.5', '{"fish": 2}', 'bbox_2d None is not four numbers'),
        ('qwen2.5', '"fish"', 'JSON str, not a list'),
        ('qwen2.5', '[[1, 2, 3, 4]]', 'item 0: JSON list, not an object'),
        ('qwen3', '[{"bbox_2d": [1, 2, 30], "label": "fish"}]', 'not four numbers'),
        ('qwen3', '[{"bbox_2d": ["1", 2, 30, 40], "label": "fish"}]', 'not four numbers'),
        ('qwen3', '[{"bbox_2d": [1, 2, 30, 40], "label": ""}]', 'item 0: no label'),
        ('qwen3', '[{"bbox_2d": [1, 2, 30, 40]}]', 'item 0: no label'),
        ('qwen3', '[{"bbox_2d": [500, 2, 30, 40], "label": "fish"}]', 'has no area'),  # corners swapped
        ('qwen3', '[{"bbox_2d": [1001, 2, 1200, 40], "label": "fish"}]', 'has no area'),  # outside
        ('paligemma', 'trash', 'is not <locYYYY>'),
        ('paligemma', '<loc0256><loc0128><loc0768> trash', 'is not <locYYYY>'),
        ('paligemma', '<loc0256><loc0128><loc0768><loc0512>', 'no label'),
        ('paligemma', '<loc0256><loc0128><loc1768><loc0512> trash', 'above 1023'),
        ('florence2', 'a bottle on the sand', 'is not label<loc_X>'),
        ('florence2', 'bottle<loc_1><loc_2><loc_3><loc_4><loc_5>', 'not whole boxes'),
        ('florence2', 'bottle<loc_1><loc_2><loc_3><loc_1000>', 'bins 0-999'),
    ],
)
def test_malformed_answers_are_parse_failures_never_no_objects(box_format, text, reason):
    prediction = detection_prediction(text, box_format, (100, 100), CLASSES, MATCH)
    assert prediction.error.startswith('unparseable answer: ') and reason in prediction.error
    assert prediction.values == {} and prediction.detections == () and prediction.text == text.strip()
    with pytest.raises(ValueError, match='.'):
        parse_grounding(text, box_format, (100, 100), MATCH)


def test_default_questions_and_formats_per_family():
    assert grounding_question(None, 'paligemma', CLASSES) == 'detect animal ; vegetation ; object ; trash'
    florence = grounding_question(None, 'florence2', CLASSES)
    assert florence == '<OPEN_VOCABULARY_DETECTION>{class}'  # asked once per class
    assert grounding_questions(florence, ['fish', 'can']) == [
        '<OPEN_VOCABULARY_DETECTION>fish',
        '<OPEN_VOCABULARY_DETECTION>can',
    ]
    assert grounding_questions('<OD>', CLASSES) == ['<OD>']  # a prompt without {class}: once
    assert grounding_questions('Where is the {class}? {"a": 1}', ['fish']) == ['Where is the fish? {"a": 1}']
    assert grounding_question(None, 'qwen2.5', ['fish']).startswith(
        'Outline the position of each fish in this underwater image and output all the coordinates in '
        'JSON format'
    )
    assert '"fish, can"' in grounding_question(None, 'qwen3', ['fish', 'can'])
    assert grounding_question('Find the trash.', 'qwen3', CLASSES) == 'Find the trash.'
    with pytest.raises(ParameterError, match='prompt must not be empty'):
        grounding_question(' ', 'qwen3', CLASSES)
    assert box_format_for(None, 'qwen2_5_vl') == 'qwen2.5' and box_format_for('qwen3', 'idefics3') == 'qwen3'
    with pytest.raises(ParameterError, match="box_format: no default for a model of family 'idefics3'"):
        box_format_for(None, 'idefics3')
    ids = {
        'Qwen/Qwen2.5-VL-7B-Instruct': 'qwen2_5_vl',
        'qwen2.5vl:7b': 'qwen2_5_vl',
        'Qwen/Qwen3-VL-8B-Instruct': 'qwen3_vl',
        'google/paligemma2-3b-mix-448': 'paligemma',
        'microsoft/Florence-2-large': 'florence2',
        'HuggingFaceTB/SmolVLM-256M-Instruct': '',
    }
    assert {model: family_of_model_id(model) for model in ids} == ids
    assert set(BOX_FORMATS) == {'qwen2.5', 'qwen3', 'paligemma', 'florence2'}
