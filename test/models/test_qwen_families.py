"""Qwen2-VL, Qwen2.5-VL, Qwen3-VL and LLaVA-OneVision end to end, as users run them: `metavlm search`
in process (count and yes/no confidence) and through `transformers serve` of the same model, and
the Qwen families' pixel scores (gradient maps) against their answers. Tiny random-weight models
built from each family's own config, processor and chat-template layout (models/tiny_families.py);
the perception node runs them in test/ros/test_nodes_with_chat_models.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from metavlm_ros.cli import main
from metavlm_ros.common.results import read_jsonl
from metavlm_ros.models.tiny_families import VIDEO_FAMILIES, build_tiny_vlm
from metavlm_ros.models.vlm import create_backend
from test.conftest import make_frame, write_frames
from test.models.generated import assert_pixel_scores_are_the_answers
from test.models.served_server import transformers_serve

#: The model class each family runs as, and the processor that brings its frames in.
EXPECTED = {
    'qwen2_vl': ('Qwen2VLForConditionalGeneration', 'Qwen2VLImageProcessorPil'),
    'qwen2_5_vl': ('Qwen2_5_VLForConditionalGeneration', 'Qwen2VLImageProcessorPil'),
    'qwen3_vl': ('Qwen3VLForConditionalGeneration', 'Qwen2VLImageProcessorPil'),
    'llava_onevision': ('LlavaOnevisionForConditionalGeneration', 'LlavaOnevisionImageProcessorPil'),
}
#: Frames far apart (black, noise, a scene of another shape: dynamic resolution and AnyRes give it
#: other token counts), so that even a random model's greedy answers differ between them.
FRAMES = [
    np.zeros((48, 64, 3), np.uint8),
    np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8),
    make_frame(40, 72, 3),
]


@pytest.fixture(scope='module')
def families(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp('qwen')
    return {family: build_tiny_vlm(family, root / family) for family in VIDEO_FAMILIES}


@pytest.fixture(scope='module')
def frames(tmp_path_factory) -> Path:
    return write_frames(tmp_path_factory.mktemp('frames'), 2, 64, 48)


@pytest.mark.parametrize('family', VIDEO_FAMILIES)
@pytest.mark.parametrize('kind', ['count', 'confidence'])
def test_metavlm_search_runs_the_family(families, frames, tmp_path, capsys, family, kind):
    out = tmp_path / 'results'
    code = main([
        'search', str(frames), '--backend', 'vlm', '--model', str(families[family]), '--kind', kind,
        '--max-new-tokens', '6', '--population', '4', '--evaluations', '8', '--out', str(out), '--quiet',
    ])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    model = json.loads((out / 'search.json').read_text())['identity']['model']
    architecture, image_processor = EXPECTED[family]
    assert model['architectures'] == [architecture] and model['model_type'] == family
    assert model['image_processor'] == image_processor and model['options']['kind'] == kind
    records = read_jsonl(out / 'evaluations.jsonl')
    assert len(records) == 16 and {r['kind'] for r in records} == {kind}
    assert not any(r['failed'] for r in records)
    if kind == 'confidence':
        values = np.array([list(r['source'].values()) for r in records], dtype=float)
        assert ((values > 0) & (values < 1)).all()


@pytest.mark.parametrize('family', VIDEO_FAMILIES)
def test_transformers_serve_of_the_family_answers_as_in_process(families, tmp_path, family):
    """`transformers serve` picks the torchvision image processor when torchvision is installed:
    the in-process model is asked to use the same one, and then every answer is the same text."""
    with transformers_serve(families[family], tmp_path / 'serve.log') as (endpoint, served_id):
        remote = create_backend('openai', served_id, endpoint=endpoint, max_new_tokens=6, max_in_flight=2)
        try:
            over_http = remote.predict(FRAMES)
        finally:
            remote.close()
        local = create_backend(
            'vlm', str(families[family]), device='cpu', max_new_tokens=6, image_processor='torchvision'
        )
        in_process = local.predict(FRAMES)
        assert [p.text for p in over_http] == [p.text for p in in_process]
        assert over_http == in_process
        assert len({p.text for p in over_http}) > 1  # answers depend on the frame: a real comparison
        out = tmp_path / 'results'
        code = main([
            'search', str(_one_frame(tmp_path)),
            '--backend', 'openai', '--endpoint', endpoint, '--model', served_id, '--max-new-tokens', '6',
            '--population', '4', '--evaluations', '8', '--out', str(out), '--quiet',
        ])  # fmt: skip
    assert code == 0
    records = read_jsonl(out / 'evaluations.jsonl')
    assert len(records) == 8 and not any(r['failed'] for r in records)
    assert json.loads((out / 'search.json').read_text())['identity']['model']['model'] == served_id


def _one_frame(tmp_path: Path) -> Path:
    return write_frames(tmp_path / 'frame', 1, 64, 48)


@pytest.mark.parametrize('family', ['qwen2_vl', 'qwen2_5_vl', 'qwen3_vl'])
def test_pixel_scores_are_the_answers_through_the_processor_rebuilt_in_torch(families, family):
    """Qwen2-VL's processor in torch (models/qwen_pixels.py; Qwen2.5-VL's and Qwen3-VL's too, PIL or
    torchvision) brings the pixels to the model differentiably: a yes/no model's pixel scores are
    predict's confidences, a count model's the log-probability generation gave its answer."""

    options = {'device': 'cpu', 'image_processor': 'torchvision' if family == 'qwen2_5_vl' else 'pil'}
    confidence = create_backend('vlm', str(families[family]), kind='confidence', **options)
    count = create_backend('vlm', str(families[family]), max_new_tokens=5, **options)
    # Not resized (48 x 32: multiples of 8 within the budget); resized to 32 x 72, the height first.
    # Stated tolerance: 1e-4 (measured up to 3.2e-5 on the resized frame, 1.2e-7 on the other).
    for frame in (make_frame(48, 32, seed=4), make_frame(40, 90, seed=4)):
        assert_pixel_scores_are_the_answers(confidence, count, frame, 5)
