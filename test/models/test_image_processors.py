"""Which of its family's image processors a model's frames go through (`image_processor`: pil or
torchvision): every in-process family loads with both, records the class it ran, and answers as
docs/models.md says with either; the demo models answer alike with both."""

import sys

import numpy as np
import pytest

from metavlm_ros.cli import main
from metavlm_ros.common.errors import ParameterError
from metavlm_ros.footage.scenes import SceneGenerator
from metavlm_ros.models.identity import model_identity
from metavlm_ros.models.tiny import build_tiny_model
from metavlm_ros.models.tiny_families import FAMILIES
from metavlm_ros.models.vlm import create_backend
from test.conftest import make_frame, write_frames

#: (backend, build variant) of every in-process family: the paper's, SigLIP 1 and 2, each chat family.
MODELS = [
    ('clip', {}),
    ('blip', {}),
    ('instructblip', {}),
    ('siglip', {'version': 1}),
    ('siglip', {'version': 2}),
    *(('vlm', {'family': family}) for family in FAMILIES),
]
IDS = [f'{backend}-{"-".join(map(str, variant.values())) or "paper"}' for backend, variant in MODELS]
FRAMES = [make_frame(96, 64, seed=1), make_frame(40, 72, seed=2)]


@pytest.fixture(scope='module')
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp('processors')
    return {name: build_tiny_model(b, root / name, **v) for name, (b, v) in zip(IDS, MODELS, strict=True)}


def _image_processor(backend) -> object:
    processor = backend.chat.processor if hasattr(backend, 'chat') else backend.processor
    return processor.image_processor


@pytest.mark.parametrize('choice', ['pil', 'torchvision'])
@pytest.mark.parametrize(('name', 'model'), list(zip(IDS, MODELS, strict=True)), ids=IDS)
def test_every_family_runs_and_records_the_image_processor_asked_for(built, name, model, choice):
    backend_name, _ = model
    options = {'image_processor': choice}
    if backend_name == 'vlm':
        options['kind'] = 'confidence'
    backend = create_backend(backend_name, str(built[name]), device='cpu', **options)
    ran = type(_image_processor(backend)).__name__
    # The identity, read before any model loads, names the class that then ran.
    identity = model_identity(backend_name, str(built[name]), options)
    assert identity['image_processor'] == ran and identity['options']['image_processor'] == choice
    assert ran.endswith('Pil') == (choice == 'pil'), ran
    predictions = backend.predict(FRAMES)
    assert len(predictions) == 2 and not any(p.error for p in predictions)
    for prediction in predictions:
        values = np.array(list(prediction.values.values()), dtype=float)
        assert list(prediction.values) == ['animal', 'vegetation', 'object', 'trash']
        if prediction.kind == 'confidence':  # docs/models.md: a probability (SigLIP, vlm) or a cosine (CLIP)
            assert np.isfinite(values).all() and (values >= -1).all() and (values <= 1).all()
        else:  # counts: whole numbers, never negative
            assert (values >= 0).all() and (values == np.round(values)).all()


def _demo_frames() -> list[np.ndarray]:
    return [SceneGenerator(width=640, height=360, seed=seed).frame(0)[0] for seed in range(8)]


def test_the_demo_models_answer_alike_with_either_image_processor():
    """Measured on these 8 demo frames (docs/models.md): CLIP's confidences differ by at most 1e-4,
    BLIP's counts not at all. Stated tolerance: CLIP 1e-3 (ten times the measured difference, which
    comes from PIL's and torchvision's bicubic resampling, not from float32 summation order); BLIP may
    change one count of one frame of eight at most."""
    frames = _demo_frames()
    answers = {}
    for backend in ('clip', 'blip'):
        for choice in ('pil', 'torchvision'):
            model = create_backend(backend, 'demo', device='cpu', image_processor=choice)
            answers[backend, choice] = np.array(
                [list(p.values.values()) for p in model.predict(frames)], dtype=float
            )
    clip = np.abs(answers['clip', 'pil'] - answers['clip', 'torchvision'])
    assert clip.max() <= 1e-3
    assert clip.max() > 0  # the two processors really differ: the comparison is a real one
    differing = (answers['blip', 'pil'] != answers['blip', 'torchvision']).any(axis=1)
    assert differing.sum() <= 1


def test_torchvision_asked_where_it_is_not_installed_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, 'torchvision', None)  # as in an environment without it
    with pytest.raises(ParameterError, match="^image_processor 'torchvision' needs torchvision, which"):
        create_backend('clip', 'demo', device='cpu', image_processor='torchvision')


def test_resume_refuses_another_image_processor(built, tmp_path, capsys):
    frames = write_frames(tmp_path / 'frames', 1, 64, 48)
    out = tmp_path / 'res'
    common = [
        'search',
        str(frames),
        '--backend',
        'vlm',
        '--model',
        str(built['vlm-qwen2_vl']),
        '--kind',
        'confidence',
        '--population',
        '4',
        '--evaluations',
        '8',
        '--out',
        str(out),
        '--quiet',
    ]
    assert main(common) == 0
    capsys.readouterr()
    assert main([*common, '--resume', '--image-processor', 'torchvision']) == 2
    err = capsys.readouterr().err.strip()
    assert 'model.image_processor' in err and 'model.options.image_processor' in err and '\n' not in err
