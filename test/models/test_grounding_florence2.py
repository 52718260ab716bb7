"""Florence-2 grounding (models/prompt_formats.py FLORENCE2_TASK): a tiny random Florence-2 in process and a
scripted server asked one open-vocabulary detection per class, each answer decoded with its <loc_N>
tokens and read as boxes in the pixels of the frame given, or as a failed evaluation."""

import pytest
import torch

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.method.boxes import Detection
from metavlm_ros.method.prediction import CLASSES
from metavlm_ros.models.tiny import build_tiny_model
from metavlm_ros.models.tiny_florence import FLORENCE2_SIDE
from metavlm_ros.models.vlm import create_backend, model_identity
from test.conftest import make_frame
from test.models.served_server import ScriptedServer, chat_body

FRAME = make_frame(640, 360, seed=0)
TRASH = 'trash<loc_100><loc_200><loc_300><loc_400>'
#: The box TRASH's bins imply on a 640 x 360 frame: bin centres, (bin + 0.5) / 1000 of each side
#: (the processor squashes every frame to one square, so the bins span the whole frame).
TRASH_BOX = (100.5 * 0.64, 200.5 * 0.36, 300.5 * 0.64, 400.5 * 0.36)
OVD = '<OPEN_VOCABULARY_DETECTION>'


@pytest.fixture(scope='module')
def florence(tmp_path_factory):
    directory = build_tiny_model('vlm', tmp_path_factory.mktemp('florence2') / 'model', family='florence2')
    return create_backend('vlm', str(directory), device='cpu', kind='detection', max_new_tokens=4)


def _script(backend, monkeypatch, answers):
    """Make the model generate `answers[class]` (else nothing) for each class it is asked about, as
    token ids the way Florence-2 generates them: </s> (decoding starts there), <s>, the answer, </s>,
    padding. Returns the sentences the processor made of the prompts, as they reach the model."""
    tokenizer, asked = backend.chat.tokenizer, []

    def generate(**inputs):
        sentence = tokenizer.decode(inputs['input_ids'][0], skip_special_tokens=True)
        asked.append(sentence)
        text = next((a for cls, a in answers.items() if f' {cls} ' in sentence), '')
        ids = tokenizer(f'</s><s>{text}</s><pad><pad>', add_special_tokens=False)['input_ids']
        return torch.tensor([ids] * len(inputs['input_ids']))

    monkeypatch.setattr(backend.chat.model, 'generate', generate)
    return asked


def test_the_tiny_florence2_keeps_the_released_layout(florence):
    tokenizer, processor = florence.chat.tokenizer, florence.chat.processor
    bins = tokenizer('<loc_0><loc_999>', add_special_tokens=False)['input_ids']
    assert len(bins) == 2 and set(bins) <= set(tokenizer.all_special_ids)  # skipped by a plain decode
    images = processor.image_processor
    assert (images.size['height'], images.size['width'], images.do_center_crop) == (64, 64, False)
    assert processor.num_image_tokens == (FLORENCE2_SIDE // 32) ** 2 + 1
    assert florence.chat.model.config.model_type == 'florence2'
    assert sum(p.numel() for p in florence.chat.model.parameters()) < 250_000


def test_random_answers_are_failed_evaluations_one_answer_a_class(florence):
    predictions = florence.predict([FRAME, make_frame(64, 48, seed=1)])
    assert florence.kind == 'detection' and florence.asked.box_format == 'florence2'
    assert florence.asked.questions == [OVD + cls for cls in CLASSES]
    for prediction in predictions:
        assert prediction.kind == 'detection' and prediction.text.count('\n') == len(CLASSES) - 1
        # A random model writes words without <loc_N> boxes: gibberish, never no objects.
        assert prediction.error.startswith('unparseable answer: answer 0: ') and prediction.values == {}


def test_an_answer_becomes_the_box_its_bins_imply_as_transformers_reads_it(florence, monkeypatch):
    asked = _script(florence, monkeypatch, {'trash': TRASH})
    (prediction,) = florence.predict([FRAME])
    assert asked == [f'Locate {cls} in the image.' for cls in CLASSES]  # the processor's own sentence
    assert prediction.detections == (Detection('trash', 1.0, pytest.approx(TRASH_BOX)),)
    assert prediction.values == {'animal': 0.0, 'vegetation': 0.0, 'object': 0.0, 'trash': 1.0}
    assert prediction.text == '\n' * 3 + TRASH and not prediction.error  # the <loc_N> tokens kept
    # transformers' own reading of the same answer: the same box, cut to whole pixels.
    read = florence.chat.processor.post_process_generation(
        f'</s><s>{TRASH}</s>', task=OVD, image_size=(640, 360)
    )
    assert read[OVD]['bboxes'] == [[int(v) for v in TRASH_BOX]] and read[OVD]['bboxes_labels'] == ['trash']


def test_an_answer_that_does_not_parse_fails_the_frame(florence, monkeypatch):
    _script(florence, monkeypatch, {'object': 'a bottle on the sand', 'trash': TRASH})
    (prediction,) = florence.predict([FRAME])
    assert prediction.error == (
        "unparseable answer: answer 2: 'a bottle on the sand' is not label<loc_X><loc_Y><loc_X><loc_Y>..."
    )
    assert prediction.values == {} and prediction.detections == () and TRASH in prediction.text


def test_the_identity_names_the_family_and_its_task_prompt(florence):
    identity = florence.identity()
    assert identity['architecture'] == 'Florence2ForConditionalGeneration'
    assert (identity['model_type'], identity['prompt_format']) == ('florence2', 'florence2-task')
    assert identity['chat_template_sha256'] == '' and identity['input_side'] == FLORENCE2_SIDE
    described = model_identity('vlm', florence.model_path, {'kind': 'detection'})
    assert (described['model_type'], described['box_format']) == ('florence2', 'florence2')


def test_a_task_prompt_of_ones_own_and_the_kinds_it_refuses(florence, monkeypatch):
    directory = florence.model_path
    own = create_backend('vlm', directory, device='cpu', kind='detection', prompt='<OD>')
    assert own.asked.questions == ['<OD>']  # no {class}: asked once a frame
    asked = _script(own, monkeypatch, {})
    (prediction,) = own.predict([FRAME])
    assert (
        asked == ['Locate the objects with category name in the image.'] and prediction.values['trash'] == 0
    )
    for kind in ('count', 'confidence'):
        with pytest.raises(ParameterError, match=f'florence2-task prompts.* kind detection only, not {kind}'):
            create_backend('vlm', directory, device='cpu', kind=kind)


def test_a_served_florence2_is_asked_once_per_class():
    def answer(body):
        question = body['messages'][0]['content'][1]['text']
        return 200, chat_body(TRASH if question == OVD + 'trash' else ''), 0.0

    model = 'microsoft/Florence-2-large'
    with ScriptedServer(answer, models=(model,)) as server:
        backend = create_backend('openai', model, endpoint=server.endpoint, kind='detection')
        try:
            (prediction,) = backend.predict([FRAME])
        finally:
            backend.close()
        sent = sorted(r['messages'][0]['content'][1]['text'] for r in server.requests[1:])
    assert sent == sorted(OVD + cls for cls in CLASSES)
    assert prediction.detections == (Detection('trash', 1.0, pytest.approx(TRASH_BOX)),)
