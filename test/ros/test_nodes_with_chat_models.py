"""Both nodes with today's VLMs: a chat model in process (`backend: vlm`) and one served over the
OpenAI-compatible API (`backend: openai`), driven by `metavlm run` on footage."""

import pytest
import yaml

from metavlm_ros.cli import main
from metavlm_ros.common.results import read_identity, read_jsonl
from metavlm_ros.models.tiny import build_tiny_model
from test.conftest import write_frames
from test.models.served_server import transformers_serve


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
    return write_frames(tmp_path_factory.mktemp('frames'), 2, 64, 48)


@pytest.fixture(scope='module')
def smolvlm(tmp_path_factory):
    return build_tiny_model('vlm', tmp_path_factory.mktemp('idefics3'), family='idefics3')


def _params(tmp_path, model: dict, endpoint: str = 'ros'):
    tester = {
        **model,
        'vlm_endpoint': endpoint,
        'population': 4,
        'evaluations': 8,
        'frame_period_s': 0.0,
        'results_dir': str(tmp_path / 'results'),
    }
    blocks = {'metavlm_perception': {'ros__parameters': model}, 'metavlm_tester': {'ros__parameters': tester}}
    path = tmp_path / 'params.yaml'
    path.write_text(yaml.safe_dump(blocks), encoding='utf-8')
    return path


@pytest.mark.parametrize(('endpoint', 'kind'), [('ros', 'confidence'), ('inprocess', 'count')])
def test_a_chat_model_judges_the_tester_s_frames(tmp_path, smolvlm, folder, endpoint, kind):
    model = {'backend': 'vlm', 'model': str(smolvlm), 'device': 'cpu', 'kind': kind, 'max_new_tokens': 4}
    code = main(
        ['run', '--params', str(_params(tmp_path, model, endpoint)), '--source', str(folder), '--rate', '4']
    )
    assert code == 0
    records = read_jsonl(tmp_path / 'results' / 'evaluations.jsonl')
    assert (
        records and {r['kind'] for r in records} == {kind} and {r['endpoint'] for r in records} == {endpoint}
    )
    assert not any(r['failed'] for r in records)
    identity = read_identity(tmp_path / 'results')
    if endpoint == 'inprocess':  # the tester's own model: its options are its identity
        assert identity['model']['backend'] == 'vlm' and identity['model']['options']['kind'] == 'count'


def test_a_served_model_judges_through_the_perception_node(tmp_path, tmp_path_factory, folder):
    llava = build_tiny_model('vlm', tmp_path_factory.mktemp('llava'), family='llava')
    with transformers_serve(llava, tmp_path / 'serve.log') as (endpoint, served_id):
        model = {'backend': 'openai', 'model': served_id, 'endpoint': endpoint, 'max_new_tokens': 4}
        code = main(
            ['run', '--params', str(_params(tmp_path, model)), '--source', str(folder), '--rate', '4']
        )
    assert code == 0
    records = read_jsonl(tmp_path / 'results' / 'evaluations.jsonl')
    assert records and {r['kind'] for r in records} == {'count'} and not any(r['failed'] for r in records)
    # The perception node names the served model in its answers: the tester records it.
    assert {r['model'] for r in records} == {served_id}


@pytest.mark.parametrize(
    ('family', 'image_processor'),
    [('qwen2_vl', 'pil'), ('qwen2_5_vl', 'torchvision'), ('qwen3_vl', 'pil'), ('llava_onevision', 'pil')],
)
def test_the_perception_node_runs_the_qwen_and_onevision_families(tmp_path, folder, family, image_processor):
    directory = build_tiny_model('vlm', tmp_path / family, family=family)
    model = {
        'backend': 'vlm',
        'model': str(directory),
        'device': 'cpu',
        'kind': 'confidence',
        'image_processor': image_processor,
    }
    code = main(['run', '--params', str(_params(tmp_path, model)), '--source', str(folder), '--rate', '4'])
    assert code == 0
    records = read_jsonl(tmp_path / 'results' / 'evaluations.jsonl')
    assert records and {r['kind'] for r in records} == {'confidence'}
    assert {r['endpoint'] for r in records} == {'ros'} and not any(r['failed'] for r in records)
    # The perception node names the model it runs in its answers: the tester records that name.
    assert {r['model'] for r in records} == {str(directory)}
