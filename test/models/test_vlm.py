"""Tests of the VLM backends on tiny random-initialised models, loaded offline through the real code path."""

import hashlib
import shutil
import time

import numpy as np
import pytest

from metavlm_ros.common.errors import InputError, ModelError, ParameterError
from metavlm_ros.method.prediction import CLASSES, Prediction
from metavlm_ros.models import model_files, vlm
from metavlm_ros.models.counts import parse_counts
from metavlm_ros.models.tiny import build_tiny_model
from metavlm_ros.models.vlm import (
    DEFAULT_CLASS_PROMPTS,
    PAPER_CLASS_PROMPTS,
    TABLE1_PROMPT,
    create_backend,
    resolve_model,
    weights_hash,
)
from test.conftest import make_frame

FRAMES = [make_frame(64 + 8 * i, 48 + 4 * i, seed=i) for i in range(5)]


@pytest.fixture(scope='module')
def clip(tiny_clip_dir):
    return create_backend('clip', str(tiny_clip_dir), device='cpu', batch_size=2)


@pytest.fixture(scope='module')
def blip(tiny_blip_dir):
    return create_backend('blip', str(tiny_blip_dir), device='cpu', batch_size=2, max_new_tokens=4)


@pytest.fixture(scope='module')
def instructblip(tiny_instructblip_dir):
    directory = str(tiny_instructblip_dir)
    return create_backend('instructblip', directory, device='cpu', batch_size=2, max_new_tokens=4)


def _check(predictions, kind, n):
    assert len(predictions) == n
    for prediction in predictions:
        assert isinstance(prediction, Prediction)
        assert prediction.kind == kind
        assert tuple(prediction.values) == CLASSES
        assert all(isinstance(v, float) for v in prediction.values.values())


def test_every_registered_backend_builds_a_tiny_model_that_loads_under_its_name(tiny_model_dirs):
    from metavlm_ros.models.vlm import BACKENDS

    # The registry is what every caller reads (campaign files, node parameters, the command line):
    # a backend registered there is tested through its own tiny model (its module's build_tiny).
    for name, implementation in BACKENDS.items():
        if not implementation.local_model:
            continue  # a served model has no weights here (test/models/test_served.py serves one)
        backend = create_backend(name, str(tiny_model_dirs(name)), device='cpu')
        assert type(backend) is implementation and backend.name == name
        assert backend.kind in implementation.kinds


def test_campaign_files_offer_the_registered_backends():
    from metavlm_ros.campaign.config import parse_config
    from metavlm_ros.models.vlm import BACKENDS

    with pytest.raises(ParameterError) as refused:
        parse_config({'frames': {'generate': {'count': 1}}, 'models': [{'backend': 'nope', 'model': 'demo'}]})
    assert f'(choose from {", ".join(BACKENDS)})' in str(refused.value)


@pytest.mark.parametrize('n', [1, 5])
def test_clip_predicts_one_confidence_per_class(clip, n):
    predictions = clip.predict(FRAMES[:n])
    _check(predictions, 'confidence', n)
    for prediction in predictions:
        assert prediction.text == ''
        assert all(-1.0 <= v <= 1.0 for v in prediction.values.values())
    assert (clip.kind, clip.name, clip.classes) == ('confidence', 'clip', CLASSES)


@pytest.mark.parametrize('backend', ['blip', 'instructblip'])
@pytest.mark.parametrize('n', [1, 5])
def test_count_backends_predict_parsed_counts(request, backend, n):
    model = request.getfixturevalue(backend)
    predictions = model.predict(FRAMES[:n])
    _check(predictions, 'count', n)
    for prediction in predictions:
        assert prediction.values == {c: float(v) for c, v in parse_counts(prediction.text).items()}
        # The answer alone is parsed: the captioner's and the language model's echo of the prompt is cut.
        assert 'how many animals' not in prediction.text.lower()
    assert (model.kind, model.name, model.prompt) == ('count', backend, TABLE1_PROMPT)


def test_clip_batched_and_one_by_one_agree(clip, tiny_clip_dir):
    single = create_backend('clip', str(tiny_clip_dir), device='cpu', batch_size=1)
    batched = clip.predict(FRAMES)
    one_by_one = [single.predict([frame])[0] for frame in FRAMES]
    for a, b in zip(batched, one_by_one, strict=True):
        np.testing.assert_allclose(list(a.values.values()), list(b.values.values()), atol=1e-4)


@pytest.mark.parametrize('backend', ['blip', 'instructblip'])
def test_count_batched_and_one_by_one_agree(request, backend):
    model = request.getfixturevalue(backend)
    # Three frames at batch size 2: a full batch and a partial one.
    batched = model.predict(FRAMES[:3])
    one_by_one = [model.predict([frame])[0] for frame in FRAMES[:3]]
    assert [p.text for p in batched] == [p.text for p in one_by_one]


def test_clip_cosine_matches_the_model_forward(clip):
    import torch

    predictions = clip.predict(FRAMES[:3])
    prompts = [clip.class_prompts[c] for c in CLASSES]
    inputs = clip.processor(text=prompts, images=[f for f in FRAMES[:3]], return_tensors='pt', padding=True)
    with torch.inference_mode():
        out = clip.model(**inputs)
        # CLIP's forward returns logit_scale * cosine; dividing the scale out gives the paper's confidence.
        expected = (out.logits_per_image / clip.model.logit_scale.exp()).numpy()
    got = np.array([list(p.values.values()) for p in predictions])
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_clip_softmax_is_softmax_of_scaled_cosine(clip, tiny_clip_dir):
    soft = create_backend('clip', str(tiny_clip_dir), device='cpu', confidence='softmax')
    cosine = np.array([list(p.values.values()) for p in clip.predict(FRAMES)])
    probabilities = np.array([list(p.values.values()) for p in soft.predict(FRAMES)])
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-6)
    logits = float(clip.model.logit_scale.detach().exp()) * cosine
    expected = np.exp(logits - logits.max(axis=1, keepdims=True))
    expected /= expected.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(probabilities, expected, atol=1e-5)


def test_clip_text_embeddings_are_computed_once(clip, monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError('text embeddings recomputed')

    monkeypatch.setattr(clip.model, 'get_text_features', fail)
    _check(clip.predict(FRAMES[:2]), 'confidence', 2)


def test_clip_paper_prompt_preset_is_the_authors_and_the_default_stays(tiny_clip_dir, clip):
    paper = create_backend('clip', str(tiny_clip_dir), device='cpu', prompts='paper')
    # The authors' four category prompts, word for word, with raw cosine similarities.
    assert paper.class_prompts['animal'] == (
        'an underwater image containing fish, sharks, turtles, dolphins, jellyfish, and sea creatures '
        'with count'
    )
    assert paper.class_prompts['trash'] == (
        'an underwater image containing plastic bottles, trash bags, marine debris, and garbage in water '
        'with count'
    )
    assert paper.class_prompts == PAPER_CLASS_PROMPTS and paper.confidence == 'cosine'
    assert clip.class_prompts == DEFAULT_CLASS_PROMPTS  # the current prompts remain the default preset
    assert paper.predict(FRAMES[:1])[0].values != clip.predict(FRAMES[:1])[0].values
    mixed = create_backend(
        'clip', str(tiny_clip_dir), device='cpu', prompts='paper', class_prompts={'trash': 'a can'}
    )
    assert mixed.class_prompts == {**PAPER_CLASS_PROMPTS, 'trash': 'a can'}
    with pytest.raises(ParameterError, match="prompts: 'authors' is not one of default, paper"):
        create_backend('clip', str(tiny_clip_dir), device='cpu', prompts='authors')


def test_clip_custom_classes_and_prompts(tiny_clip_dir, clip):
    custom = create_backend(
        'clip',
        str(tiny_clip_dir),
        device='cpu',
        classes=('animal', 'rock'),
        class_prompts={'animal': 'a fish'},
    )
    assert custom.class_prompts == {'animal': 'a fish', 'rock': 'a photo of rock underwater'}
    prediction = custom.predict(FRAMES[:1])[0]
    assert tuple(prediction.values) == ('animal', 'rock')
    # Another prompt, another text embedding: the animal confidence changes.
    default = clip.predict(FRAMES[:1])[0].values['animal']
    assert prediction.values['animal'] != pytest.approx(default, abs=1e-6)


def test_blip_question_answering_checkpoint_is_detected(tiny_blip_dir, tmp_path):
    from transformers import BlipConfig, BlipForQuestionAnswering

    target = tmp_path / 'vqa'
    shutil.copytree(tiny_blip_dir, target)
    (target / 'model.safetensors').unlink()
    BlipForQuestionAnswering(BlipConfig.from_pretrained(target)).save_pretrained(target)
    backend = create_backend('blip', str(target), device='cpu', max_new_tokens=4)
    assert type(backend.model).__name__ == 'BlipForQuestionAnswering'
    _check(backend.predict(FRAMES[:3]), 'count', 3)


def test_tiny_models_are_deterministic_per_seed(tmp_path, tiny_clip_dir):
    again = build_tiny_model('clip', tmp_path / 'again', seed=0)
    other = build_tiny_model('clip', tmp_path / 'other', seed=1)
    assert weights_hash(again) == weights_hash(tiny_clip_dir)
    assert weights_hash(other) != weights_hash(tiny_clip_dir)
    assert (again / 'tokenizer.json').read_bytes() == (tiny_clip_dir / 'tokenizer.json').read_bytes()
    a = create_backend('clip', str(again), device='cpu').predict(FRAMES[:2])
    b = create_backend('clip', str(tiny_clip_dir), device='cpu').predict(FRAMES[:2])
    assert a == b


def test_weights_hash_is_sha256_of_the_safetensors(tiny_clip_dir, clip):
    path = tiny_clip_dir / 'model.safetensors'
    expected = hashlib.sha256(b'model.safetensors' + path.read_bytes()).hexdigest()
    assert weights_hash(tiny_clip_dir) == expected[:12]
    assert len(weights_hash(tiny_clip_dir)) == 12
    # The loaded model's: the whole digest, as identity records hold it (model_identity).
    assert clip.weights_hash() == expected


def test_weights_hash_reads_unchanged_weights_once_and_changed_ones_again(
    tiny_clip_dir, tmp_path, monkeypatch
):
    model = shutil.copytree(tiny_clip_dir, tmp_path / 'model')
    digests, sha256 = [], hashlib.sha256
    monkeypatch.setattr(model_files.hashlib, 'sha256', lambda *a: digests.append(sha256(*a)) or digests[-1])
    first = weights_hash(model, length=64)
    assert weights_hash(model, length=64) == first and len(digests) == 1  # the same files: not read again
    # Retrained in place: same name and size, other bytes.
    data = bytearray((model / 'model.safetensors').read_bytes())
    data[-1] ^= 0xFF
    (model / 'model.safetensors').write_bytes(bytes(data))
    expected = sha256(b'model.safetensors' + bytes(data)).hexdigest()
    assert weights_hash(model, length=64) == expected != first and len(digests) == 2


def test_model_id_and_path(clip, tiny_clip_dir):
    assert clip.model_id == str(tiny_clip_dir)
    assert resolve_model('clip', str(tiny_clip_dir)) == str(tiny_clip_dir.resolve())


def test_hugging_face_id_resolves_from_the_local_cache(tmp_path, tiny_clip_dir, monkeypatch):
    import huggingface_hub.constants

    commit = 'a' * 40
    repo = tmp_path / 'hub' / 'models--metavlm--tiny-clip'
    shutil.copytree(tiny_clip_dir, repo / 'snapshots' / commit)
    (repo / 'refs').mkdir()
    (repo / 'refs' / 'main').write_text(commit)
    monkeypatch.setattr(huggingface_hub.constants, 'HF_HUB_CACHE', str(tmp_path / 'hub'))
    backend = create_backend('clip', 'metavlm/tiny-clip', device='cpu')
    assert backend.model_id == 'metavlm/tiny-clip'
    local = create_backend('clip', str(tiny_clip_dir), device='cpu')
    assert backend.predict(FRAMES[:1]) == local.predict(FRAMES[:1])


@pytest.mark.parametrize(
    ('backend', 'model', 'message'),
    [
        ('clip', '/nonexistent/metavlm/model-dir', 'does not exist'),
        ('blip', './no-such-dir/', 'does not exist'),
        ('clip', 'metavlm-test/no-such-model', 'hf download metavlm-test/no-such-model'),
        ('instructblip', 'Salesforce/instructblip-not-cached', 'local directory'),
        ('llava', 'whatever', "unknown backend 'llava'; valid backends: "),
        ('clip', '  ', 'no model given'),
    ],
)
def test_missing_models_fail_fast_with_one_line(backend, model, message):
    start = time.monotonic()
    with pytest.raises(ModelError, match=message) as info:
        create_backend(backend, model)
    assert time.monotonic() - start < 5.0
    assert '\n' not in str(info.value)


def test_directory_without_config_is_refused(tmp_path):
    with pytest.raises(ModelError, match='no config.json'):
        resolve_model('clip', str(tmp_path))
    (tmp_path / 'weights.bin').write_bytes(b'')
    with pytest.raises(ModelError, match='is a file'):
        resolve_model('clip', str(tmp_path / 'weights.bin'))


def test_wrong_model_family_is_a_model_error(tiny_clip_dir):
    with pytest.raises(ModelError, match='cannot load blip model'):
        create_backend('blip', str(tiny_clip_dir), device='cpu')


def test_demo_model_missing_says_how_to_build(tmp_path, monkeypatch):
    monkeypatch.setattr(model_files, '_DEMO_ROOT', tmp_path)
    with pytest.raises(ModelError, match='demo model for clip is not built; run metavlm train-demo-models'):
        resolve_model('clip', 'demo')


def test_demo_model_resolves_inside_the_package(tmp_path, monkeypatch, tiny_clip_dir):
    shutil.copytree(tiny_clip_dir, tmp_path / 'demo-clip')
    monkeypatch.setattr(model_files, '_DEMO_ROOT', tmp_path)
    assert resolve_model('clip', 'demo') == str(tmp_path / 'demo-clip')
    assert create_backend('clip', 'demo', device='cpu').model_id == 'demo'


@pytest.mark.parametrize(
    ('options', 'message'),
    [
        ({'confidence': 'logits'}, 'confidence'),
        ({'dtype': 'int8'}, 'dtype'),
        ({'batch_size': 0}, 'batch_size'),
        ({'device': 'tpu'}, 'device'),
        ({'classes': ()}, 'classes'),
        ({'class_prompts': {'mammal': 'a seal'}}, 'unknown class'),
    ],
)
def test_bad_options_are_parameter_errors(tiny_clip_dir, options, message):
    with pytest.raises(ParameterError, match=message):
        create_backend('clip', str(tiny_clip_dir), **options)


def test_bad_count_options_are_parameter_errors(tiny_blip_dir):
    with pytest.raises(ParameterError, match='unknown class'):
        create_backend('blip', str(tiny_blip_dir), vocabularies={'mammal': ['seal']})
    with pytest.raises(ParameterError, match='max_new_tokens'):
        create_backend('blip', str(tiny_blip_dir), max_new_tokens=0)


@pytest.mark.parametrize(
    'bad',
    [
        np.zeros((8, 8), np.uint8),
        np.zeros((8, 8, 4), np.uint8),
        np.zeros((8, 8, 3), np.float32),
        np.zeros((0, 8, 3), np.uint8),
        'frame.png',
    ],
)
def test_bad_frames_are_input_errors(clip, bad):
    with pytest.raises(InputError, match='frame 1'):
        clip.predict([FRAMES[0], bad])


def test_empty_input_gives_no_predictions(clip):
    assert clip.predict([]) == []


@pytest.mark.gpu
@pytest.mark.parametrize('backend', ['clip', 'blip', 'instructblip'])
def test_cuda_matches_cpu(tiny_model_dirs, backend):
    import torch

    if not torch.cuda.is_available():
        pytest.skip('no CUDA device')
    directory = str(tiny_model_dirs(backend))
    gpu = create_backend(backend, directory, device='auto', dtype='float32', max_new_tokens=8)
    cpu = create_backend(backend, directory, device='cpu', max_new_tokens=8)
    assert gpu.device.type == 'cuda'
    a, b = gpu.predict(FRAMES), cpu.predict(FRAMES)
    if backend == 'clip':
        values = [[list(p.values.values()) for p in predictions] for predictions in (a, b)]
        np.testing.assert_allclose(values[0], values[1], atol=1e-3)
    else:
        assert all(p.kind == 'count' for p in a)
    half = create_backend(backend, directory, device='cuda', dtype='float16', max_new_tokens=8)
    assert len(half.predict(FRAMES)) == len(FRAMES)


def test_importing_vlm_loads_neither_torch_nor_transformers():
    import subprocess
    import sys

    code = (
        'import sys, metavlm_ros.models.vlm; '
        "print('torch' in sys.modules, 'transformers' in sys.modules, 'huggingface_hub' in sys.modules)"
    )
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split() == ['False', 'False', 'False']


def test_strided_frames_give_the_same_prediction_as_contiguous_copies(clip):
    views = [FRAMES[0][:, ::-1], FRAMES[1][::2, ::2]]
    copies = [np.ascontiguousarray(v) for v in views]
    assert clip.predict(views) == clip.predict(copies)


@pytest.mark.parametrize('dtype', ['float16', 'bfloat16'])
def test_half_precision_follows_float32(tiny_clip_dir, clip, dtype):
    import torch

    half = create_backend('clip', str(tiny_clip_dir), device='cpu', dtype=dtype)
    assert half.model.dtype == getattr(torch, dtype)
    got = [list(p.values.values()) for p in half.predict(FRAMES[:2])]
    want = [list(p.values.values()) for p in clip.predict(FRAMES[:2])]
    np.testing.assert_allclose(got, want, atol=0.01)


@pytest.fixture(scope='module')
def instructblip_t5(tmp_path_factory):
    directory = build_tiny_model('instructblip', tmp_path_factory.mktemp('t5'), language_model='t5')
    return create_backend('instructblip', str(directory), device='cpu', max_new_tokens=4)


def _answer(backend, text):
    return backend.processor.tokenizer(text, add_special_tokens=False, return_tensors='pt')['input_ids'][0]


def _fake_generate(monkeypatch, backend, make_output):
    import torch

    def generate(**inputs):
        return torch.stack([make_output(inputs, row) for row in range(inputs['pixel_values'].shape[0])])

    monkeypatch.setattr(backend.model, 'generate', generate)


def test_blip_captioner_answer_is_cut_after_the_echoed_prompt(blip, monkeypatch):
    import torch

    answer = _answer(blip, 'Animals: 2 fish Trash: 1 can')
    bos = blip.model.config.text_config.bos_token_id
    # The captioner's output: [DEC], the prompt without [CLS] and its final [SEP], then the answer.
    _fake_generate(
        monkeypatch,
        blip,
        lambda inputs, row: torch.cat([torch.tensor([bos]), inputs['input_ids'][row, 1:-1], answer]),
    )
    predictions = blip.predict(FRAMES[:3])
    assert [p.text for p in predictions] == ['animals : 2 fish trash : 1 can'] * 3
    assert predictions[0].values == {'animal': 2.0, 'vegetation': 0.0, 'object': 0.0, 'trash': 1.0}


def test_instructblip_decoder_only_answer_is_cut_after_the_input(instructblip, monkeypatch):
    import torch

    answer = _answer(instructblip, 'Animals: 2 fish, a crab Vegetation: None')
    _fake_generate(
        monkeypatch, instructblip, lambda inputs, row: torch.cat([inputs['input_ids'][row], answer])
    )
    predictions = instructblip.predict(FRAMES[:2])
    assert [p.text for p in predictions] == ['Animals: 2 fish, a crab Vegetation: None'] * 2
    assert predictions[1].values['animal'] == 3.0


def test_instructblip_encoder_decoder_output_is_all_answer(instructblip_t5, monkeypatch):
    import torch

    assert instructblip_t5.model.config.text_config.is_encoder_decoder
    start = instructblip_t5.model.config.text_config.decoder_start_token_id
    answer = _answer(instructblip_t5, 'two fish near a bottle')
    _fake_generate(
        monkeypatch, instructblip_t5, lambda inputs, row: torch.cat([torch.tensor([start]), answer])
    )
    prediction = instructblip_t5.predict(FRAMES[:1])[0]
    assert prediction.text == 'two fish near a bottle'
    assert prediction.values == {'animal': 2.0, 'vegetation': 0.0, 'object': 0.0, 'trash': 1.0}


def test_instructblip_flan_t5_variant_predicts(instructblip_t5):
    _check(instructblip_t5.predict(FRAMES[:2]), 'count', 2)


def test_unknown_tiny_language_model_is_refused(tmp_path):
    with pytest.raises(ParameterError, match='language_model'):
        build_tiny_model('instructblip', tmp_path, language_model='gpt')
    with pytest.raises(ModelError, match='valid backends'):
        build_tiny_model('llava', tmp_path)


def test_class_prompts_as_a_list_follow_the_class_order(tiny_clip_dir):
    from metavlm_ros.models.vlm import DEFAULT_CLASS_PROMPTS

    backend = create_backend(
        'clip', str(tiny_clip_dir), device='cpu', class_prompts=['a fish', '', 'a pipe', 'a can']
    )
    assert backend.class_prompts == {
        'animal': 'a fish',
        'vegetation': DEFAULT_CLASS_PROMPTS['vegetation'],
        'object': 'a pipe',
        'trash': 'a can',
    }
    with pytest.raises(ParameterError, match='3 prompts for 4 classes'):
        create_backend('clip', str(tiny_clip_dir), device='cpu', class_prompts=['a', 'b', 'c'])


# -- the batched pixel path against the Hugging Face processor -------------------------------------


def _real_size_processors():
    """The released models' image processors, from config objects (nothing downloads).

    CLIPImageProcessorPil's defaults are openai/clip-vit-base-patch32's (shorter side 224, 224 crop,
    bicubic); BlipImageProcessorPil's are Salesforce/blip-*-base's (384 x 384, bicubic). The PIL ones:
    PixelPath reproduces those (image_processor 'pil'); the torchvision ones run as they are.
    """
    from transformers.models.blip.image_processing_pil_blip import BlipImageProcessorPil
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    return {'clip-vit-b32': (CLIPImageProcessorPil(), 224), 'blip-base': (BlipImageProcessorPil(), 384)}


def _grey_levels(got, expected, path):
    import torch

    return ((got - expected).abs() * torch.tensor(path.std).view(1, 3, 1, 1) * 255).flatten()


def _noisy_frame(width, height):
    """A structured frame with sensor-like noise: fine texture is where resamplers differ most."""
    noise = np.random.default_rng(0).integers(0, 40, (height, width, 3))
    return np.clip(make_frame(width, height, seed=1).astype(int) + noise, 0, 255).astype(np.uint8)


@pytest.mark.parametrize('name', ['clip-vit-b32', 'blip-base'])
def test_pixel_path_reproduces_the_real_size_processor(name):
    import torch

    processor, side = _real_size_processors()[name]
    path = vlm.PixelPath.from_processor(processor)
    assert path is not None and path.input_size == side
    # Up to 4x the input side (REDUCING_GAP 2) the same PIL filter runs on the same pixels: equal.
    for width, height in [(448, 252), (768, 432), (300, 500), (224, 224), (96, 64), (640, 480)]:
        frame = _noisy_frame(width, height)
        expected = processor(images=[frame], return_tensors='pt')['pixel_values']
        got = path.pixel_values([frame], 'cpu', torch.float32)
        assert got.shape == expected.shape
        assert _grey_levels(got, expected, path).max() < 1e-3, (width, height)


@pytest.mark.parametrize('name', ['clip-vit-b32', 'blip-base'])
def test_pixel_path_on_large_frames_stays_within_the_stated_tolerance(name):
    import torch

    processor, side = _real_size_processors()[name]
    path = vlm.PixelPath.from_processor(processor)
    frame = _noisy_frame(1920, 1080)
    expected = processor(images=[frame], return_tensors='pt')['pixel_values']
    # PIL's box reduction first (REDUCING_GAP): docs/performance.md states mean <= 0.5, max <= 8 levels.
    direct = _grey_levels(path.pixel_values([frame], 'cpu', torch.float32), expected, path)
    assert float(direct.mean()) <= 0.5 and float(direct.max()) <= 8
    # The default working size (2x the input side, area filter) before it: mean <= 1, p99 <= 4 levels.
    from metavlm_ros.common.images import resize_longer_side

    small = resize_longer_side(frame, 2 * side)
    worked = _grey_levels(path.pixel_values([small], 'cpu', torch.float32), expected, path)
    assert float(worked.mean()) <= 1.0 and float(worked.quantile(0.99)) <= 4


def test_pixel_path_leaves_unknown_processors_to_the_processor():
    from transformers import BlipImageProcessor, CLIPImageProcessor

    # The torchvision ones resample otherwise than PIL: they judge their frames themselves.
    assert vlm.PixelPath.from_processor(CLIPImageProcessor()) is None
    assert vlm.PixelPath.from_processor(BlipImageProcessor()) is None
    assert vlm.PixelPath.from_processor(CLIPImageProcessor(do_pad=True)) is None
    assert (
        vlm.PixelPath.from_processor(CLIPImageProcessor(size={'shortest_edge': 224, 'longest_edge': 300}))
        is None
    )
    assert vlm.PixelPath.from_processor(BlipImageProcessor(do_normalize=False)) is None
    assert vlm.PixelPath.from_processor(object()) is None


@pytest.mark.parametrize('backend', ['clip', 'blip', 'instructblip'])
def test_batched_and_processor_preprocessing_judge_alike(request, backend):
    model = request.getfixturevalue(backend)
    reference = create_backend(
        backend,
        model.model_path,
        device='cpu',
        batch_size=2,
        preprocess='processor',
        **({} if backend == 'clip' else {'max_new_tokens': 4}),
    )
    assert model._pixel_path is not None and reference._pixel_path is None
    assert model.input_size == reference.input_size == 32
    # Frames under 4x the tiny input side: resampled exactly as the processor does, so judged alike.
    frames = [make_frame(120, 100, seed=3), *FRAMES[:2]]
    got, expected = model.predict(frames), reference.predict(frames)
    for a, b in zip(got, expected, strict=True):
        assert a.text == b.text
        np.testing.assert_allclose(list(a.values.values()), list(b.values.values()), atol=1e-5)


def test_preprocess_must_be_known(tiny_clip_dir):
    with pytest.raises(ParameterError, match='preprocess'):
        create_backend('clip', str(tiny_clip_dir), device='cpu', preprocess='fast')
