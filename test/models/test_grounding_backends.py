"""Grounding answers through the chat backends: a tiny Qwen2.5-VL in process, a scripted OpenAI-compatible
server over HTTP, each answer read as boxes in the pixels of the frame given or as a failed evaluation."""

import json

import pytest
from PIL import Image

from metavlm_ros.common.errors import ModelError, ParameterError
from metavlm_ros.method.boxes import Detection
from metavlm_ros.method.encoding import SearchSpace
from metavlm_ros.method.search import SearchConfig, run_search
from metavlm_ros.models.grounding import RELEASED_QWEN_RESIZE, grounding_question
from metavlm_ros.models.questions import DETECTION_MAX_NEW_TOKENS
from metavlm_ros.models.tiny import build_tiny_model
from metavlm_ros.models.vlm import create_backend, model_identity
from test.conftest import make_frame
from test.models.served_server import ScriptedServer, chat_body

FRAME = make_frame(64, 48, seed=0)
CLASSES = ('animal', 'vegetation', 'object', 'trash')
QWEN25 = 'Qwen/Qwen2.5-VL-7B-Instruct'


@pytest.fixture(scope='module')
def qwen(tmp_path_factory):
    """A tiny random Qwen2.5-VL asked for boxes (its processor shrinks 64 x 48 to 48 x 40)."""
    directory = build_tiny_model('vlm', tmp_path_factory.mktemp('grounding') / 'qwen', family='qwen2_5_vl')
    return create_backend('vlm', str(directory), device='cpu', kind='detection', max_new_tokens=6)


def _answer(*objects) -> str:
    return '```json\n' + json.dumps([{'bbox_2d': box, 'label': label} for label, box in objects]) + '\n```'


def test_the_resize_read_from_the_processor_is_the_one_it_applies(qwen):
    images = qwen.chat.processor.image_processor
    for width, height in [(64, 48), (40, 100), (10, 10), (200, 30), (13, 57)]:
        grid = images(images=[Image.new('RGB', (width, height))], return_tensors='pt')['image_grid_thw'][0]
        resized = (int(grid[2]) * images.patch_size, int(grid[1]) * images.patch_size)
        assert qwen.asked.resize.size(width, height) == resized


def test_a_qwen2_5_grounding_answer_becomes_boxes_in_frame_pixels(qwen, monkeypatch):
    assert qwen.kind == 'detection' and qwen.asked.box_format == 'qwen2.5'
    assert qwen.asked.question == grounding_question(None, 'qwen2.5', CLASSES)
    asked = []

    def generate(frames, question, max_new_tokens):
        asked.append((len(frames), question, max_new_tokens))
        # In the processor's 48 x 40 input: a can at its centre, a fish along its bottom edge.
        return [_answer(('can', [12, 10, 36, 30]), ('fish', [0, 30, 48, 40]), ('rock', [1, 1, 2, 2]))] * len(
            frames
        )

    monkeypatch.setattr(qwen.chat, 'generate', generate)
    big = make_frame(640, 480, seed=1)  # shrunk to 48 x 40 as well: every box scales by (40/3, 12)
    small, large = qwen.predict([FRAME, big])
    assert asked == [(2, qwen.asked.question, 6)]
    assert small.detections == (
        Detection('trash', 1.0, pytest.approx((16.0, 12.0, 48.0, 36.0))),
        Detection('animal', 1.0, pytest.approx((0.0, 36.0, 64.0, 48.0))),
    )
    assert large.detections[0].box == pytest.approx((160.0, 120.0, 480.0, 360.0))
    assert small.values == {'animal': 1.0, 'vegetation': 0.0, 'object': 0.0, 'trash': 1.0}
    assert 'rock' in small.text and not small.error


def test_random_answers_are_failed_evaluations_of_a_search(qwen):
    (source,) = qwen.predict([FRAME])
    assert source.error.startswith('unparseable answer: ') and source.text  # gibberish, never no objects
    # Without the source's boxes the frame is done: nothing to compare follow-ups with.
    config = SearchConfig(
        algorithm='random', population=4, evaluations=4, seed=0, space=SearchSpace.from_options(['rotation'])
    )
    assert run_search(FRAME, qwen, config).source_error == source.error
    # With a source given, every follow-up the random model answers is a failed evaluation.
    given = qwen.asked.answer([_answer(('fish', [0, 0, 24, 20]))], FRAME)
    result = run_search(FRAME, qwen, config, source=given)
    followups = [ev for ev in result.evaluations if ev.composition.order > 0]
    assert followups and all(ev.failed for ev in followups)


def test_the_default_question_and_answer_length_and_refused_options(qwen, tmp_path):
    directory = qwen.model_path
    loaded = create_backend(
        'vlm', directory, device='cpu', kind='detection', box_format='qwen3', prompt='Boxes?'
    )
    assert (loaded.asked.box_format, loaded.asked.question) == ('qwen3', 'Boxes?')
    assert loaded.max_new_tokens == DETECTION_MAX_NEW_TOKENS  # 40 holds one object
    assert model_identity('vlm', directory, {'kind': 'detection'})['box_format'] == 'qwen2.5'  # the family's
    with pytest.raises(ParameterError, match='box_format is for kind detection'):
        create_backend('vlm', directory, device='cpu', box_format='qwen3')
    with pytest.raises(ParameterError, match='answer_format is for kind count'):
        create_backend('vlm', directory, device='cpu', kind='detection', answer_format='json')
    with pytest.raises(ParameterError, match='box_format: .* not one of'):
        create_backend('vlm', directory, device='cpu', kind='detection', box_format='yolo')


def test_a_processor_that_crops_frames_cannot_ground(tmp_path):
    # LLaVA-1.5's CLIP processor keeps the middle square of a wide frame: its boxes are not the frame's.
    directory = build_tiny_model('vlm', tmp_path / 'llava', family='llava')
    with pytest.raises(ModelError, match='crops frames'):
        create_backend('vlm', str(directory), device='cpu', kind='detection', box_format='qwen3')


# -- served ------------------------------------------------------------------------------------------


def test_a_served_qwen2_5_answer_becomes_boxes_in_frame_pixels():
    # The released processor brings 64 x 48 to 56 x 56 (multiples of 28, at least 3136 pixels).
    assert RELEASED_QWEN_RESIZE.size(64, 48) == (56, 56)
    answer = _answer(('plastic bag', [14, 14, 42, 42]), ('kelp', [0, 0, 56, 56]))
    with ScriptedServer(lambda body: (200, chat_body(answer), 0.0), models=(QWEN25,)) as server:
        backend = create_backend('openai', QWEN25, endpoint=server.endpoint, kind='detection')
        try:
            (prediction,) = backend.predict([FRAME])
        finally:
            backend.close()
        sent = server.requests[-1]
    assert backend.kind == 'detection' and backend.asked.box_format == 'qwen2.5'
    assert sent['messages'][0]['content'][1]['text'] == grounding_question(None, 'qwen2.5', CLASSES)
    assert sent['temperature'] == 0 and sent['max_tokens'] == DETECTION_MAX_NEW_TOKENS
    assert prediction.detections == (
        Detection('trash', 1.0, pytest.approx((16.0, 12.0, 48.0, 36.0))),
        Detection('vegetation', 1.0, pytest.approx((0.0, 0.0, 64.0, 48.0))),
    )
    assert prediction.text == answer.strip() and set(prediction.evidence) == {'latency_s', 'retries'}


@pytest.mark.parametrize(
    ('model', 'box_format', 'answer', 'box'),
    [
        (
            'Qwen/Qwen3-VL-8B-Instruct',
            None,
            _answer(('fish', [250, 500, 750, 1000])),
            (16.0, 24.0, 48.0, 48.0),
        ),
        ('google/paligemma2-3b-mix-448', None, '<loc0512><loc0256><loc1024><loc0768> fish', None),
        (
            'my-finetune',
            'paligemma',
            '<loc0512><loc0256><loc1023><loc0768> fish',
            (16.0, 24.0, 48.0, 47.953125),
        ),
    ],
)
def test_served_formats_follow_the_model_id_or_the_option(model, box_format, answer, box):
    with ScriptedServer(lambda body: (200, chat_body(answer), 0.0), models=(model,)) as server:
        backend = create_backend(
            'openai', model, endpoint=server.endpoint, kind='detection', box_format=box_format
        )
        try:
            (prediction,) = backend.predict([FRAME])
        finally:
            backend.close()
        asked = server.requests[-1]['messages'][0]['content'][1]['text']
    assert asked == grounding_question(None, backend.asked.box_format, CLASSES)
    if box is None:  # bin 1024 is past PaliGemma's 0-1023: a failed evaluation, not no fish
        assert prediction.error.startswith('unparseable answer: ') and prediction.values == {}
    else:
        assert [d.box for d in prediction.detections] == [pytest.approx(box)]


def test_a_served_model_of_no_known_family_needs_a_box_format():
    with pytest.raises(ParameterError, match="box_format: no default for a model of family 'unknown'"):
        create_backend('openai', 'my-finetune', endpoint='http://127.0.0.1:9/v1', kind='detection')
