"""Attribution maps (explain/attribution.py): a model that looks at one region gets its mass there."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.explain.attribution import (
    GRID,
    INTEGRATED_GRADIENTS,
    OCCLUSION,
    difference_figures,
    gradient_map,
    mass_figures,
    occlusion_grid,
    occlusion_map,
    pixel_scorer,
)
from metavlm_ros.models.tiny import build_tiny_model
from metavlm_ros.models.tiny_detectors import DETECTOR_FAMILIES
from metavlm_ros.models.vlm import create_backend
from test.conftest import make_frame
from test.explain.region import BOTTOM_LEFT, TOP_RIGHT, RegionBackend, region_mask

FRAME = make_frame(64, 48, seed=3)
#: The share of the mass a map must put on the region the model looks at: both methods put all of
#: it there; a map mirrored puts none there, one shifted by a 6 x 8 grid's cell about 0.75.
PROOF_SHARE = 0.9
#: A 6 x 8 occlusion grid and the frame itself: on 64 x 48 pixels its cells' edges fall on the
#: quadrants' edges, as a finer grid's would on a real frame.
OCCLUSION_FRAMES = 49


def _cells_of(region: tuple[float, float, float, float]) -> set[tuple[int, int]]:
    top, bottom, left, right = region
    rows = range(round(top * GRID), round(bottom * GRID))
    return {(r, c) for r in rows for c in range(round(left * GRID), round(right * GRID))}


def _pixels(frame: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(frame).permute(2, 0, 1)[None].float()


@pytest.mark.parametrize('region', [TOP_RIGHT, BOTTOM_LEFT], ids=['top-right', 'bottom-left'])
@pytest.mark.parametrize('method', [INTEGRATED_GRADIENTS, OCCLUSION])
def test_a_model_that_looks_at_one_region_gets_its_mass_there(region, method):
    backend = RegionBackend(region)
    if method == INTEGRATED_GRADIENTS:
        made = gradient_map(backend, FRAME, 'trash', steps=8)
    else:
        made = occlusion_map(backend, FRAME, 'trash', OCCLUSION_FRAMES)
    assert made.method == method and made.mass.shape == FRAME.shape[:2]
    assert made.mass.min() >= 0 and made.mass.sum() == pytest.approx(1.0)
    assert made.mass[region_mask(FRAME.shape, region)].sum() >= PROOF_SHARE
    summary = made.summary()
    top = summary['top_cell']
    assert (top['row'], top['col']) in _cells_of(region)
    assert sum(map(sum, summary['grid'])) == pytest.approx(1.0)
    assert summary['score'] == pytest.approx(backend.predict([FRAME])[0].values['trash'])
    if method == OCCLUSION:
        # The frame itself and one frame a cell, every one judged through predict and counted.
        assert (made.detail['rows'], made.detail['cols']) == (6, 8)
        assert made.frames_judged == backend.frames_judged - 1 == OCCLUSION_FRAMES
    else:
        # Integrated gradients' completeness: the attributions add up to the score's rise.
        assert made.frames_judged == 8 + 2 and backend.frames_judged == 1
        assert abs(made.detail['completeness_gap']) < 0.01


def test_the_occlusion_grid_is_the_finest_the_budget_pays_for():
    assert occlusion_grid(5, 64, 48) == (2, 2)
    assert occlusion_grid(49, 64, 48) == (6, 8)
    assert occlusion_grid(49, 48, 64) == (8, 6)
    for frames in range(5, 120):
        rows, cols = occlusion_grid(frames, 160, 120)
        assert rows * cols + 1 <= frames and rows * cols >= (frames - 1) // 2
    with pytest.raises(ParameterError, match='at least 5 frames'):
        occlusion_grid(4, 64, 48)


def test_the_figures_say_where_the_mass_lies_and_how_far_it_moved():
    source = np.zeros((48, 64))
    source[0, 63] = 1.0  # all of it in the top-right pixel
    figures = mass_figures(source)
    assert figures['top_cell'] == {'row': 0, 'col': GRID - 1, 'share': 1.0}
    assert figures['centroid'] == pytest.approx([63.5 / 64, 0.5 / 48])
    assert figures['area_50'] == pytest.approx(1 / source.size)
    followup = np.zeros_like(source)
    followup[47, 0] = 1.0
    moved = difference_figures(source, followup)
    assert moved['moved'] == pytest.approx(1.0)
    assert moved['top_gain'] == {'row': GRID - 1, 'col': 0, 'share': 1.0}
    assert moved['top_loss'] == {'row': 0, 'col': GRID - 1, 'share': -1.0}
    assert difference_figures(source, source)['moved'] == 0.0
    assert mass_figures(np.zeros_like(source))['top_cell'] is None


@pytest.fixture(scope='module')
def tiny_clip(tiny_clip_dir):
    return create_backend('clip', str(tiny_clip_dir), device='cpu', batch_size=8)


def test_clip_and_siglip_scores_through_the_differentiable_path_are_their_answers(
    tiny_clip, tiny_model_dirs, tmp_path
):
    siglip = create_backend('siglip', str(tiny_model_dirs('siglip')), device='cpu')
    for backend in (tiny_clip, siglip):
        scorer = pixel_scorer(backend)
        assert scorer is not None, backend.name
        # At the model's input size nothing is resized: the same numbers as its answers.
        square = make_frame(32, 32, seed=1)
        answer = list(backend.predict([square])[0].values.values())
        assert scorer(_pixels(square))[0].tolist() == pytest.approx(answer, abs=1e-5)
        # A larger frame goes through torch's resize, close to PIL's but not the same.
        answer = list(backend.predict([FRAME])[0].values.values())
        assert scorer(_pixels(FRAME))[0].tolist() == pytest.approx(answer, abs=5e-3)
    # SigLIP 2's NaFlex patches have no differentiable path here: it is mapped by occlusion.
    siglip2 = create_backend(
        'siglip', str(build_tiny_model('siglip', tmp_path / 's2', version=2)), device='cpu'
    )
    assert pixel_scorer(siglip2) is None
    with pytest.raises(ParameterError, match='no gradients'):
        gradient_map(siglip2, FRAME, 'trash', steps=2)


def test_a_tiny_clip_map_has_the_frame_shape_and_is_finite(tiny_clip):
    made = gradient_map(tiny_clip, FRAME, 'trash', steps=4)
    assert made.mass.shape == FRAME.shape[:2] and np.isfinite(made.mass).all()
    assert made.mass.sum() == pytest.approx(1.0) and made.mass.min() >= 0
    assert made.frames_judged == 4 + 2 and np.isfinite(made.detail['completeness_gap'])
    occluded = occlusion_map(tiny_clip, FRAME, 'trash', 9)
    assert occluded.mass.shape == FRAME.shape[:2] and np.isfinite(occluded.mass).all()
    assert occluded.frames_judged <= 9 and occluded.model_calls == 2  # the frame, then one batch


@pytest.fixture(scope='module')
def tiny_gradient_backends(tiny_model_dirs, tiny_blip_dir):
    """The in-process backends with pixel scores of their own: each detector family (every slot a
    detection, so every class has a score), BLIP, a chat VLM with a CLIP processor (LLaVA-1.5) and
    one with Qwen2-VL's."""
    backends = {
        family: create_backend(
            'detector', str(tiny_model_dirs('detector', family=family)), device='cpu', score_threshold=0.0
        )
        for family in DETECTOR_FAMILIES
    }
    backends['blip'] = create_backend('blip', str(tiny_blip_dir), device='cpu', max_new_tokens=4)
    llava = tiny_model_dirs('vlm', family='llava')
    backends['llava'] = create_backend('vlm', str(llava), device='cpu', max_new_tokens=4)
    # Qwen2-VL's dynamic-resolution patches (models/qwen_pixels.py): a yes/no model.
    qwen = tiny_model_dirs('vlm', family='qwen2_vl')
    backends['qwen2_vl'] = create_backend('vlm', str(qwen), device='cpu', kind='confidence')
    return backends


@pytest.mark.parametrize('name', [*DETECTOR_FAMILIES, 'blip', 'llava', 'qwen2_vl'])
def test_detectors_and_chat_models_are_mapped_by_gradients(tiny_gradient_backends, name):
    backend = tiny_gradient_backends[name]
    assert pixel_scorer(backend) is not None
    made = gradient_map(backend, FRAME, 'trash', steps=2)
    assert made.method == INTEGRATED_GRADIENTS and made.mass.shape == FRAME.shape[:2]
    assert np.isfinite(made.mass).all() and made.mass.sum() == pytest.approx(1.0)
    assert made.frames_judged == 2 + 2 and np.isfinite(made.score)


def test_a_class_the_model_does_not_judge_is_refused():
    with pytest.raises(ParameterError, match="class 'crab'"):
        gradient_map(RegionBackend(TOP_RIGHT), FRAME, 'crab', steps=2)
