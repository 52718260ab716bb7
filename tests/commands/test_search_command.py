"""`metavlm search` end to end with a tiny CLIP, and its answers to bad input."""

import cv2
import pytest

from metavlm_ros.cli import main
from metavlm_ros.core.results import read_jsonl
from tests.conftest import make_frame


@pytest.fixture
def image_path(tmp_path):
    path = tmp_path / 'frame.png'
    cv2.imwrite(str(path), make_frame(96, 64)[..., ::-1])
    return path


def search(args, tiny_clip_dir):
    return main(['search', *args, '--backend', 'clip', '--model', str(tiny_clip_dir), '--quiet'])


def test_search_writes_results_and_prints_a_summary(tmp_path, image_path, tiny_clip_dir, capsys):
    out = tmp_path / 'res'
    code = search(
        [str(image_path), '--population', '6', '--evaluations', '18', '--out', str(out)], tiny_clip_dir
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert 'hypervolume' in printed and 'violations by order' in printed and str(out) in printed
    assert len(read_jsonl(out / 'evaluations.jsonl')) == 18
    assert len(read_jsonl(out / 'summary.jsonl')) == 1


def test_search_works_at_twice_the_model_input_by_default(tmp_path, tiny_clip_dir, capsys):
    # The tiny CLIP sees 32x32: by default a 160x120 frame is searched at 64x48.
    path = tmp_path / 'big.png'
    cv2.imwrite(str(path), make_frame(160, 120)[..., ::-1])
    common = [str(path), '--population', '4', '--evaluations', '4']
    assert search([*common, '--out', str(tmp_path / 'auto')], tiny_clip_dir) == 0
    (summary,) = read_jsonl(tmp_path / 'auto' / 'summary.jsonl')
    assert summary['working_size'] == 64 and summary['source_size'] == [160, 120]
    assert 'relations at working size 64 px (frame 160x120' in capsys.readouterr().out
    assert search([*common, '--out', str(tmp_path / 'full'), '--working-size', 'full'], tiny_clip_dir) == 0
    (summary,) = read_jsonl(tmp_path / 'full' / 'summary.jsonl')
    assert summary['working_size'] == 160


def test_existing_results_are_kept_unless_resume_or_overwrite(tmp_path, image_path, tiny_clip_dir, capsys):
    out = tmp_path / 'res'
    args = [str(image_path), '--population', '6', '--evaluations', '12', '--out', str(out)]
    assert search(args, tiny_clip_dir) == 0
    before = (out / 'evaluations.jsonl').read_bytes()
    assert search(args, tiny_clip_dir) == 2
    assert 'already holds results' in capsys.readouterr().err
    assert (out / 'evaluations.jsonl').read_bytes() == before
    assert search([*args, '--resume'], tiny_clip_dir) == 0
    assert 'already searched' in capsys.readouterr().out
    assert (out / 'evaluations.jsonl').read_bytes() == before


@pytest.mark.parametrize(
    ('extra', 'needle'),
    [
        (['--evaluations', '0'], 'evaluations'),
        (['--population', '-3'], 'population'),
        (['--range', 'rotation=-9:9'], 'rotation'),
        (['--relations', 'blur'], 'blur'),
        (['--algorithm', 'annealing'], 'algorithm'),
        (['--working-size', 'half'], 'working size'),
    ],
)
def test_bad_parameters_give_one_line_and_exit_2(tmp_path, image_path, tiny_clip_dir, capsys, extra, needle):
    code = search([str(image_path), '--out', str(tmp_path / 'r'), *extra], tiny_clip_dir)
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith('metavlm: error:') and needle in err and '\n' not in err
    assert not (tmp_path / 'r' / 'evaluations.jsonl').exists()


def test_bad_frames_and_models_give_one_line(tmp_path, image_path, tiny_clip_dir, capsys):
    text = tmp_path / 'notes.png'
    text.write_text('not an image')
    empty = tmp_path / 'empty.png'
    empty.write_bytes(b'')
    for path in (text, empty, tmp_path / 'missing.png'):
        assert search([str(path), '--out', str(tmp_path / 'r')], tiny_clip_dir) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith('metavlm: error:') and str(path.name) in err and '\n' not in err
    assert main(['search', str(image_path), '--backend', 'llava', '--out', str(tmp_path / 'r')]) == 2
    assert 'llava' in capsys.readouterr().err
    assert (
        main(['search', str(image_path), '--model', str(tmp_path / 'nomodel'), '--out', str(tmp_path / 'r')])
        == 2
    )
    assert 'nomodel' in capsys.readouterr().err


def test_class_prompts_map_onto_the_classes(tmp_path, image_path, tiny_clip_dir, capsys):
    out = tmp_path / 'res'
    prompts = ['a fish', 'a plant', 'a pipe', 'a bottle']
    args = [
        str(image_path),
        '--population',
        '4',
        '--evaluations',
        '4',
        '--out',
        str(out),
        '--class-prompts',
        *prompts,
    ]
    assert search(args, tiny_clip_dir) == 0
    assert search([*args[:-1], '--overwrite'], tiny_clip_dir) == 2
    assert '3 prompts for 4 classes' in capsys.readouterr().err


def test_blip_search_with_a_custom_vocabulary(tmp_path, image_path, tiny_blip_dir):
    out = tmp_path / 'res'
    code = main(
        [
            'search',
            str(image_path),
            '--backend',
            'blip',
            '--model',
            str(tiny_blip_dir),
            '--quiet',
            '--population',
            '4',
            '--evaluations',
            '4',
            '--max-new-tokens',
            '8',
            '--out',
            str(out),
            '--vocabulary',
            'trash=bottle,can',
        ]
    )
    assert code == 0
    (summary,) = read_jsonl(out / 'summary.jsonl')
    assert summary['kind'] == 'count' and set(summary['source']) == {
        'animal',
        'vegetation',
        'object',
        'trash',
    }
