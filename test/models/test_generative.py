"""ChatModel on tiny random-weight VLMs of each family: batched equals one-at-a-time; its refusals."""

import json
import shutil

import numpy as np
import pytest
import torch

from metavlm_ros.common.errors import ModelError
from metavlm_ros.models.generative import PREFIX_FAMILIES, ChatModel
from metavlm_ros.models.tiny import build_tiny_model
from metavlm_ros.models.tiny_families import FAMILIES, build_tiny_vlm
from test.conftest import make_frame

PARAMS = list(FAMILIES)

# Frames of different content and sizes: dynamic-resolution and tiling processors give them different
# numbers of image tokens, so the batch really is padded.
FRAMES = [make_frame(64, 40, seed=1), make_frame(48, 48, seed=2), make_frame(30, 60, seed=3)]
# Questions of different lengths pad the yes/no batch for every family.
QUESTIONS = ['Is there an animal in this image? Answer yes or no.', 'Is there trash?']
#: Batched and one-at-a-time float32 prefills differ only by the order of summation over padding.
TOLERANCE = 1e-4
CPU = {'device': torch.device('cpu'), 'dtype': torch.float32}
#: The side each tiny family's processor brings images to (tiny_families.py's sizes).
INPUT_SIDES = {
    'qwen2_vl': 48,
    'qwen2_5_vl': 48,
    'qwen3_vl': 48,
    'idefics3': 64,
    'paligemma': 32,
    'llava': 32,
    'llava_onevision': 64,
    'gemma3': 32,
}


@pytest.fixture(scope='module')
def tiny_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp('tiny_vlms')
    return {family: build_tiny_vlm(family, root / family) for family in FAMILIES}


@pytest.fixture(scope='module')
def models(tiny_dirs):
    return {family: ChatModel(directory, **CPU) for family, directory in tiny_dirs.items()}


def _copy(directory, tmp_path):
    return shutil.copytree(directory, tmp_path / 'model')


@pytest.mark.parametrize('family', PARAMS)
def test_loads_with_its_family_classes(models, family):
    model = models[family]
    assert model.model_type == family
    assert model.architecture == type(model.model).__name__
    assert model.architecture.endswith('ForConditionalGeneration')
    assert model.input_side == INPUT_SIDES[family]


@pytest.mark.parametrize('family', PARAMS)
def test_generate_batched_equals_one_at_a_time(models, family):
    model = models[family]
    batched = model.generate(FRAMES, 'How many animals are in this image?', max_new_tokens=6)
    alone = [
        model.generate([frame], 'How many animals are in this image?', max_new_tokens=6)[0]
        for frame in FRAMES
    ]
    assert len(batched) == len(FRAMES)
    assert all(isinstance(answer, str) and answer == answer.strip() for answer in batched)
    assert batched == alone


@pytest.mark.parametrize('family', PARAMS)
def test_yes_probability_batched_equals_one_at_a_time(models, family):
    model = models[family]
    batched = model.yes_probability(FRAMES, QUESTIONS)
    alone = np.array([[model.yes_probability([f], [q])[0, 0] for q in QUESTIONS] for f in FRAMES])
    assert batched.shape == (len(FRAMES), len(QUESTIONS))
    assert np.all((batched >= 0) & (batched <= 1))
    np.testing.assert_allclose(batched, alone, rtol=0, atol=TOLERANCE)
    # The frame reaches the answer: a model blind to its image would give every frame one value.
    assert np.ptp(batched[:, 0]) > 0


@pytest.mark.parametrize('family', PARAMS)
def test_the_questions_run_after_one_cached_image_prefix_where_the_family_allows(models, family):
    """The batched yes/no path above (two questions) is the cached-prefix one for the causal families:
    its equality with one whole prefill per (frame, question) is what proves the cache right."""
    model = models[family]
    questions = [*QUESTIONS, 'Is there a plant in this image? Answer yes or no.']
    values = model.yes_probability(FRAMES, questions)
    prompts = [model._prompt(q) for q in questions]
    suffixes = model._question_tokens(FRAMES[0], tuple(questions), prompts)
    assert (suffixes is not None) == (family in PREFIX_FAMILIES)
    if suffixes is not None:
        image_token = model.model.config.image_token_id
        whole = model._inputs(FRAMES[:1], prompts[:1])['input_ids'][0].tolist()
        length = len(whole) - len(suffixes[0])
        assert image_token in whole[:length] and whole == whole[:length] + suffixes[0]
        assert len({len(s) for s in suffixes}) > 1  # the questions' tokens really are padded
    alone = np.stack([model.yes_probability(FRAMES, [q])[:, 0] for q in questions], axis=1)
    np.testing.assert_allclose(values, alone, rtol=0, atol=TOLERANCE)


@pytest.mark.parametrize('family', PARAMS)
def test_answer_tokens_are_spellings_of_yes_and_no(models, family):
    model = models[family]
    tokens = model.answer_tokens()
    for word in ('yes', 'no'):
        spellings = {model.tokenizer.decode([i]).strip().lower() for i in tokens[word]}
        assert spellings == {word}


def test_generation_prompt_ends_the_prompt(models):
    """The first answer position is the last one: the prompt ends with the family's generation prompt."""
    endings = {
        'qwen2_vl': '<|im_start|>assistant\n',
        'qwen2_5_vl': '<|im_start|>assistant\n',
        'qwen3_vl': '<|im_start|>assistant\n',
        'idefics3': '<end_of_utterance>\nAssistant:',
        'paligemma': 'Is there trash?',  # the processor adds '\n' after the prefix (next test)
        'llava': 'Is there trash? ASSISTANT:',
        'llava_onevision': '<|im_start|>assistant\n',
        'gemma3': '<end_of_turn>\n<start_of_turn>model\n',
    }
    for family, model in models.items():
        assert model._prompt('Is there trash?').endswith(endings[family]), family


def test_paligemma_prefix_is_built_by_its_processor(models):
    """PaliGemmaProcessor puts <bos> after the image tokens and '\\n' after the task text, as released."""
    model = models['paligemma']
    inputs = model._inputs(FRAMES[:1], [model._prompt('Is there trash?')])
    tokens = model.tokenizer.convert_ids_to_tokens(inputs['input_ids'][0].tolist())
    images = model.processor.image_seq_length
    assert tokens[:images] == ['<image>'] * images
    assert tokens[images] == model.tokenizer.bos_token
    assert model.tokenizer.decode(inputs['input_ids'][0, images + 1 :]) == 'Is there trash?\n'


def test_paligemma_without_template_uses_the_prefix_format(tiny_dirs, tmp_path):
    directory = _copy(tiny_dirs['paligemma'], tmp_path)
    (directory / 'chat_template.jinja').unlink()
    model = ChatModel(directory, **CPU)
    assert model.identity()['prompt_format'] == 'paligemma-prefix'
    assert model._prompt('Is there trash?') == '<image>Is there trash?'
    assert model.yes_probability(FRAMES[:1], QUESTIONS).shape == (1, 2)


def test_identity_is_stable_and_follows_the_chat_template(tiny_dirs, models, tmp_path):
    first = models['llava'].identity()
    assert ChatModel(tiny_dirs['llava'], **CPU).identity() == first
    json.dumps(first)  # recorded in results as JSON
    assert first['image_settings']['crop_size'] == {'height': 32, 'width': 32}
    directory = _copy(tiny_dirs['llava'], tmp_path)
    template = directory / 'chat_template.jinja'
    template.write_text('{{ "A chat between a user and an assistant. " }}' + template.read_text())
    changed = ChatModel(directory, **CPU).identity()
    assert changed['chat_template_sha256'] != first['chat_template_sha256']
    assert {k: v for k, v in changed.items() if k != 'chat_template_sha256'} == {
        k: v for k, v in first.items() if k != 'chat_template_sha256'
    }


def test_identity_records_image_splitting(models):
    identity = models['idefics3'].identity()
    assert identity['image_settings']['do_image_splitting'] is True
    assert identity['image_settings']['max_image_size'] == {'longest_edge': 32}
    assert identity['token_settings']['image_seq_len'] == 4


def test_a_contrastive_checkpoint_is_refused(tmp_path):
    directory = build_tiny_model('clip', tmp_path / 'clip')
    with pytest.raises(ModelError, match='CLIPModel is not an image-text-to-text model'):
        ChatModel(directory, **CPU)


def test_a_processor_without_chat_template_is_refused(tiny_dirs, tmp_path):
    directory = _copy(tiny_dirs['llava'], tmp_path)
    (directory / 'chat_template.jinja').unlink()
    with pytest.raises(ModelError, match='no chat template'):
        ChatModel(directory, **CPU)


def test_a_tokenizer_that_splits_yes_is_refused(tiny_dirs, tmp_path):
    directory = _copy(tiny_dirs['llava'], tmp_path)
    path = directory / 'tokenizer.json'
    spec = json.loads(path.read_text())
    bpe = spec['model']
    gone = {token for token in bpe['vocab'] if token.lstrip('\u2581').lower() == 'yes'}
    assert gone  # the tiny vocabulary had them
    # Without the tokens and the merges that make them, every spelling of 'yes' is two or more pieces.
    merged = [m if isinstance(m, list) else m.split(' ') for m in bpe['merges']]
    bpe['merges'] = [m for m in merged if ''.join(m) not in gone and not gone & set(m)]
    bpe['vocab'] = {token: i for token, i in bpe['vocab'].items() if token not in gone}
    path.write_text(json.dumps(spec))
    model = ChatModel(directory, **CPU)
    assert len(model.tokenizer.encode(' yes', add_special_tokens=False)) > 1
    with pytest.raises(ModelError, match="'yes' is not a single token"):
        model.answer_tokens()
    with pytest.raises(ModelError, match="'yes' is not a single token"):
        model.yes_probability(FRAMES[:1], QUESTIONS)


def test_the_input_side_follows_idefics3_splitting(tmp_path):
    import json

    from metavlm_ros.models.image_processors import input_side

    directory = build_tiny_vlm('idefics3', tmp_path / 'idefics3')
    processor = __import__('transformers').AutoProcessor.from_pretrained(directory)
    ip = processor.image_processor
    assert ip.do_image_splitting and input_side(processor) == ip.size['longest_edge']
    config = json.loads((directory / 'processor_config.json').read_text())
    config['image_processor']['do_image_splitting'] = False
    (directory / 'processor_config.json').write_text(json.dumps(config))
    unsplit = __import__('transformers').AutoProcessor.from_pretrained(directory)
    assert input_side(unsplit) == unsplit.image_processor.max_image_size['longest_edge']
