"""The `vlm` backend (any image-text-to-text chat model, in process) as users reach it: create_backend,
`metavlm search`, a campaign, with tiny random-weight models of real families."""

import json
import shutil

import cv2
import numpy as np
import pytest

from metavlm_ros.cli import main
from metavlm_ros.common.errors import ModelError, ParameterError
from metavlm_ros.common.results import read_jsonl
from metavlm_ros.models.tiny import build_tiny_model
from metavlm_ros.models.tiny_families import FAMILIES
from metavlm_ros.models.vlm import create_backend
from test.conftest import make_frame
from test.models.generated import assert_pixel_scores_are_the_answers, generated_log_probability

FRAMES = [make_frame(64 + 8 * i, 48 + 4 * i, seed=i) for i in range(3)]
BUILT = list(FAMILIES)


@pytest.fixture(scope='module')
def family_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp('chat')
    return {family: build_tiny_model('vlm', root / family, family=family) for family in BUILT}


@pytest.fixture
def image_path(tmp_path):
    path = tmp_path / 'frame.png'
    cv2.imwrite(str(path), make_frame(96, 64)[..., ::-1])
    return path


@pytest.mark.parametrize('family', BUILT)
def test_count_answers_batched_equal_one_frame_at_a_time(family_dirs, family):
    directory = str(family_dirs[family])
    batched = create_backend('vlm', directory, device='cpu', batch_size=3, max_new_tokens=6)
    single = create_backend('vlm', directory, device='cpu', batch_size=1, max_new_tokens=6)
    assert batched.kind == 'count' and batched.input_size > 0
    got, expected = batched.predict(FRAMES), single.predict(FRAMES)
    assert [p.text for p in got] == [p.text for p in expected]
    assert [p.values for p in got] == [p.values for p in expected]
    assert all(p.kind == 'count' and not p.error for p in got)


@pytest.mark.parametrize('family', BUILT)
def test_yes_no_confidences_batched_follow_one_frame_at_a_time(family_dirs, family):
    directory = str(family_dirs[family])
    batched = create_backend('vlm', directory, device='cpu', kind='confidence', batch_size=3)
    single = create_backend('vlm', directory, device='cpu', kind='confidence', batch_size=1)
    got = np.array([list(p.values.values()) for p in batched.predict(FRAMES)])
    expected = np.array([list(p.values.values()) for p in single.predict(FRAMES)])
    # Stated tolerance: float32 sums over a padded batch differ from a single row's in the last bits.
    np.testing.assert_allclose(got, expected, atol=1e-4)
    assert got.shape == (3, 4) and ((got >= 0) & (got <= 1)).all()


def test_json_answers_that_do_not_parse_are_parse_failures_not_zero(family_dirs):
    backend = create_backend(
        'vlm', str(family_dirs['llava']), device='cpu', answer_format='json', max_new_tokens=6
    )
    predictions = backend.predict(FRAMES[:2])
    # A random-weight model answers gibberish: never read as counts.
    assert all(p.error.startswith('unparseable answer: ') and p.values == {} and p.text for p in predictions)


def test_the_questions_are_the_configured_ones(family_dirs):
    directory = str(family_dirs['idefics3'])
    asked = create_backend(
        'vlm', directory, device='cpu', kind='confidence', confidence_question='Any {class} here?'
    )
    assert asked.asked.questions == [
        'Any an animal here?',
        'Any a vegetation here?',
        'Any an object here?',
        'Any a trash here?',
    ]
    counted = create_backend('vlm', directory, device='cpu', answer_format='json', classes=['fish', 'rock'])
    assert '{"fish": 0, "rock": 0}' in counted.asked.question


@pytest.mark.parametrize(
    ('options', 'message'),
    [
        ({'kind': 'confidence', 'confidence_question': 'Is it there?'}, 'has no {class} placeholder'),
        ({'kind': 'confidence', 'answer_format': 'json'}, 'answer_format: for kind count'),
        ({'confidence_question': 'Is there {class}?'}, 'confidence_question is for kind confidence'),
        ({'prompt': '  '}, 'prompt must not be empty'),
        ({'vocabularies': {'mammal': ['seal']}}, 'unknown class'),
        ({'kind': 'caption'}, "kind: 'caption' is not one of count, confidence"),
    ],
)
def test_bad_questions_are_refused_before_the_model_loads(options, message, tmp_path):
    # The model directory does not exist: the options are refused first.
    with pytest.raises(ParameterError, match=message):
        create_backend('vlm', str(tmp_path / 'nowhere'), **options)


def test_checkpoints_that_cannot_be_asked_are_refused(family_dirs, tiny_clip_dir, tmp_path):
    with pytest.raises(ModelError, match='CLIPModel is not an image-text-to-text model'):
        create_backend('vlm', str(tiny_clip_dir), device='cpu')
    bare = shutil.copytree(family_dirs['llava'], tmp_path / 'bare')
    (bare / 'chat_template.jinja').unlink()
    for name in ('processor_config.json', 'tokenizer_config.json'):
        data = json.loads((bare / name).read_text())
        data.pop('chat_template', None)
        (bare / name).write_text(json.dumps(data))
    with pytest.raises(ModelError, match='has no chat template'):
        create_backend('vlm', str(bare), device='cpu')


def _run(args, capsys):
    code = main(['search', *args, '--quiet'])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip()


def test_metavlm_search_with_a_chat_model_records_what_identifies_it(
    family_dirs, image_path, tmp_path, capsys
):
    model = str(family_dirs['idefics3'])
    out = tmp_path / 'res'
    common = [
        str(image_path),
        '--backend',
        'vlm',
        '--model',
        model,
        '--population',
        '4',
        '--evaluations',
        '8',
    ]
    code, printed, err = _run([*common, '--kind', 'confidence', '--out', str(out)], capsys)
    assert code == 0, err
    identity = json.loads((out / 'search.json').read_text())['identity']['model']
    assert (
        identity['architectures'] == ['Idefics3ForConditionalGeneration']
        and identity['model_type'] == 'idefics3'
    )
    assert set(identity['files']) >= {'chat_template.jinja', 'tokenizer_config.json'}
    assert identity['options']['kind'] == 'confidence' and len(identity['weights_sha256']) == 64
    records = read_jsonl(out / 'evaluations.jsonl')
    assert len(records) == 8 and {r['kind'] for r in records} == {'confidence'}
    # Another question is another search: resume refuses it, naming the difference.
    changed = [*common, '--kind', 'confidence', '--confidence-question', 'Do you see {class}?']
    code, _, err = _run([*changed, '--out', str(out), '--resume'], capsys)
    assert code == 2 and 'model.options.confidence_question' in err and '\n' not in err


def test_a_model_answering_prose_to_a_json_question_is_reported_not_a_crash(
    family_dirs, image_path, tmp_path, capsys
):
    out = tmp_path / 'res'
    args = [
        str(image_path),
        '--backend',
        'vlm',
        '--model',
        str(family_dirs['llava']),
        '--answer-format',
        'json',
    ]
    code, printed, err = _run(
        [*args, '--max-new-tokens', '6', '--population', '4', '--evaluations', '8', '--out', str(out)], capsys
    )
    assert code == 0, err
    assert 'not searched: the source answer does not read (unparseable answer: ' in printed
    (summary,) = read_jsonl(out / 'summary.jsonl')
    assert summary['source_error'].startswith('unparseable answer: ') and summary['evaluations'] == 0


@pytest.mark.parametrize(
    ('args', 'message'),
    [
        (['--kind', 'confidence', '--confidence-question', 'Is it there?'], 'has no {class} placeholder'),
        (['--confidence', 'softmax'], 'confidence does not apply to backend vlm (it is an option of clip)'),
        (['--model', 'CLIP'], 'CLIPModel is not an image-text-to-text model'),
    ],
)
def test_bad_input_is_one_line_and_exit_2_with_nothing_written(
    family_dirs, tiny_clip_dir, image_path, tmp_path, capsys, args, message
):
    args = [a if a != 'CLIP' else str(tiny_clip_dir) for a in args]
    out = tmp_path / 'res'
    model = ['--model', str(family_dirs['gemma3'])]
    code, _, err = _run([str(image_path), '--backend', 'vlm', *model, *args, '--out', str(out)], capsys)
    assert code == 2 and err.startswith('metavlm: error: ') and '\n' not in err
    assert message in err
    assert not out.exists() or not any(out.iterdir())


def test_a_campaign_runs_a_chat_model(family_dirs, tmp_path):
    from metavlm_ros.campaign.config import parse_config
    from metavlm_ros.campaign.runner import run_campaign

    config = parse_config(
        {
            'frames': {'generate': {'count': 1, 'size': [64, 48]}},
            'models': [
                {
                    'name': 'smol',
                    'backend': 'vlm',
                    'model': str(family_dirs['idefics3']),
                    'kind': 'confidence',
                }
            ],
            'algorithms': ['nsga2', 'random'],
            'runs': 1,
            'population': 4,
            'evaluations': 8,
        },
        base_dir=tmp_path,
    )
    assert config.models[0].options['kind'] == 'confidence'
    run_campaign(config, tmp_path / 'campaign', progress=False, log=lambda line: None)
    cells = sorted((tmp_path / 'campaign').rglob('evaluations.jsonl.gz'))
    assert len(cells) == 2
    assert all({r['kind'] for r in read_jsonl(path)} == {'confidence'} for path in cells)
    record = json.loads((tmp_path / 'campaign' / 'campaign.json').read_text())
    (model,) = record['models']
    assert model['backend'] == 'vlm' and model['model_type'] == 'idefics3'


def test_the_seed_of_build_tiny_model_reaches_a_chat_model(tmp_path):
    from metavlm_ros.models.vlm import weights_hash

    one = build_tiny_model('vlm', tmp_path / 'a', seed=1, family='llava')
    again = build_tiny_model('vlm', tmp_path / 'b', seed=1, family='llava')
    other = build_tiny_model('vlm', tmp_path / 'c', seed=2, family='llava')
    assert weights_hash(one) == weights_hash(again) != weights_hash(other)


def test_llava_pixel_scores_are_its_own_answer_log_probability(tiny_model_dirs):
    """LLaVA-1.5's CLIP processor has a differentiable path: the pixel scores are the log-probability of
    the answer the model generates from those pixels, as generation itself scores it, with gradients."""
    import torch

    backend = create_backend(
        'vlm', str(tiny_model_dirs('vlm', family='llava')), device='cpu', max_new_tokens=5
    )
    # At the model's input size the differentiable path gives the pixel values the processor gives.
    frame = make_frame(backend.input_size, backend.input_size, seed=4)
    pixels = torch.from_numpy(frame).permute(2, 0, 1)[None].float().requires_grad_()
    scores = backend.pixel_scores(pixels)
    assert scores.shape == (1, 4) and (scores[0] == scores[0, 0]).all()  # the whole answer, every column
    scores[0, 0].backward()
    assert torch.isfinite(pixels.grad).all() and pixels.grad.abs().max() > 0
    assert scores[0, 0].item() == pytest.approx(generated_log_probability(backend, frame, 5), rel=1e-4)


@pytest.mark.parametrize('family', ['llava', 'paligemma'])
def test_yes_no_pixel_scores_are_the_confidences_predict_gives(tiny_model_dirs, family):
    """A yes/no model whose processor has a differentiable path (LLaVA's CLIP one, PaliGemma's SigLIP
    one; Qwen's: test_qwen_families.py) scores frames' pixels as predict does, with gradients."""
    import torch

    backend = create_backend(
        'vlm', str(tiny_model_dirs('vlm', family=family)), device='cpu', kind='confidence'
    )
    frame = make_frame(64, 48, seed=4)  # resized: within PIL's rounding of the processor's pixels
    pixels = torch.from_numpy(frame).permute(2, 0, 1)[None].float().requires_grad_()
    scores = backend.pixel_scores(pixels)
    scores.sum().backward()
    assert torch.isfinite(pixels.grad).all() and pixels.grad.abs().max() > 0
    # Stated tolerance: 1e-4 (measured up to 1.4e-5: float32 sums, LLaVA's cached prefix, PIL's rounding).
    expected = list(backend.predict([frame])[0].values.values())
    np.testing.assert_allclose(scores.detach().numpy()[0], expected, atol=1e-4)


@pytest.mark.parametrize(
    ('family', 'image_processor'),
    [('gemma3', 'torchvision'), ('idefics3', 'pil'), ('llava_onevision', 'pil')],
)
def test_tiling_and_square_processors_pixel_scores_are_their_answers(family_dirs, family, image_processor):
    """Gemma 3's square resize (test_pixel_path.py), Idefics3's tiles and global view (SmolVLM's;
    LANCZOS rebuilt in torch: test_idefics3_pixels.py) and LLaVA-OneVision's AnyRes tiles and base
    view (test_anyres_pixels.py) bring the pixels to the model differentiably: a yes/no model's pixel
    scores are predict's confidences, a count model's the log-probability generation gave its answer,
    on a frame each resizes (Idefics3 and LLaVA-OneVision cut it into 2 x 2 tiles and a whole view)."""

    options = {'device': 'cpu', 'image_processor': image_processor}
    confidence = create_backend('vlm', str(family_dirs[family]), kind='confidence', **options)
    count = create_backend('vlm', str(family_dirs[family]), max_new_tokens=5, **options)
    path = confidence.pixel_scores.args[0]
    assert getattr(path, 'width_first', False) == (image_processor == 'torchvision')
    # Stated tolerance: 1e-4 (measured up to 1.5e-5 for Gemma 3, 7.9e-6 for Idefics3, either processor,
    # 5.2e-6 for LLaVA-OneVision, on three frame sizes).
    assert_pixel_scores_are_the_answers(confidence, count, make_frame(64, 48, seed=4), 5)


def test_chat_models_without_a_differentiable_path_have_no_pixel_scores(tiny_model_dirs, family_dirs):
    # LLaVA-OneVision's torchvision processor is not followed; PaliGemma's answer attends otherwise
    # than its prompt (a count is scored by teacher forcing); LLaVA's torchvision processor resizes
    # otherwise than PIL; a grounding answer's boxes have no score here.
    onevision = str(family_dirs['llava_onevision'])
    options = {'device': 'cpu', 'kind': 'confidence', 'image_processor': 'torchvision'}
    assert create_backend('vlm', onevision, **options).pixel_scores is None
    paligemma = tiny_model_dirs('vlm', family='paligemma')
    assert create_backend('vlm', str(paligemma), device='cpu').pixel_scores is None
    llava = str(tiny_model_dirs('vlm', family='llava'))
    fast = create_backend('vlm', llava, device='cpu', kind='confidence', image_processor='torchvision')
    assert fast.pixel_scores is None
    qwen = str(tiny_model_dirs('vlm', family='qwen2_vl'))
    grounding = create_backend('vlm', qwen, device='cpu', kind='detection', box_format='qwen2.5')
    assert grounding.pixel_scores is None
