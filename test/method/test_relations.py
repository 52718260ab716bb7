"""Tests of the six metamorphic relations: geometry of known patterns, identities, fusion, errors."""

import math

import cv2
import numpy as np
import pytest

from metavlm_ros.common.errors import InputError, ParameterError
from metavlm_ros.method.encoding import Composition
from metavlm_ros.method.relations import (
    DEFAULT_RELATIONS,
    INSERTION_RELATIONS,
    OPTICS_RELATIONS,
    PAPER_RELATIONS,
    RELATION_BY_ID,
    RELATIONS,
    UNDERWATER_RELATIONS,
    apply_composition,
    apply_relation,
)
from metavlm_ros.method.underwater import low_light, marine_snow
from test.conftest import make_frame

W, H = 101, 81  # odd sizes put the centre ((W-1)/2, (H-1)/2) = (50, 40) on a pixel
CX, CY = 50.0, 40.0


def blob(x: float, y: float, width: int = W, height: int = H, sigma: float = 1.5) -> np.ndarray:
    """A black frame with one bright Gaussian dot centred at (x, y)."""
    yy, xx = np.mgrid[0:height, 0:width]
    grey = 255.0 * np.exp(-((xx - x) ** 2 + (yy - y) ** 2) / (2 * sigma**2))
    return np.repeat(np.round(grey).astype(np.uint8)[..., None], 3, axis=2)


def centroid(frame: np.ndarray) -> tuple[float, float]:
    """Intensity-weighted centre (x, y) of the first channel."""
    weights = frame[..., 0].astype(float)
    yy, xx = np.mgrid[0 : frame.shape[0], 0 : frame.shape[1]]
    return float((weights * xx).sum() / weights.sum()), float((weights * yy).sum() / weights.sum())


def test_table_2_in_order():
    assert RELATIONS[:6] == PAPER_RELATIONS
    assert [r.id for r in PAPER_RELATIONS] == [
        'rotation',
        'scaling',
        'histogram_equalization',
        'downsampling',
        'shear',
        'translation',
    ]
    assert [r.number for r in PAPER_RELATIONS] == [1, 2, 3, 4, 5, 6]
    rows = [(r.nominal, r.low, r.high, r.max_deviation) for r in PAPER_RELATIONS]
    assert rows == [
        (0, -5, 5, 5),
        (1, 0.7, 1.3, 0.3),
        (1, 1.0, 2.0, 1.0),
        (1, 0.9, 1.0, 0.1),
        (0, -0.15, 0.15, 0.15),
        (0, -0.03, 0.03, 0.03),
    ]
    assert RELATION_BY_ID['shear'].parameter == 'shear'


def test_rotation_turns_a_dot_about_the_centre_counter_clockwise():
    out = apply_relation(blob(80, 40), 'rotation', 5.0)
    # 30 px right of the centre, +5 degrees (counter-clockwise on screen, y pointing down):
    # x' = 50 + 30 cos 5deg = 79.886, y' = 40 - 30 sin 5deg = 37.385.
    x, y = centroid(out)
    assert x == pytest.approx(CX + 30 * math.cos(math.radians(5)), abs=0.05)
    assert y == pytest.approx(CY - 30 * math.sin(math.radians(5)), abs=0.05)
    assert out.shape == (H, W, 3) and out.dtype == np.uint8


def test_rotation_leaves_a_black_border():
    white = np.full((H, W, 3), 255, np.uint8)
    out = apply_relation(white, 'rotation', -5.0)
    assert out[0, 0].tolist() == [0, 0, 0] and out[H - 1, W - 1].tolist() == [0, 0, 0]
    assert out[int(CY), int(CX)].tolist() == [255, 255, 255]


@pytest.mark.parametrize(('zoom', 'dot', 'expected'), [(1.2, (80, 40), (86, 40)), (0.8, (50, 60), (50, 56))])
def test_scaling_moves_a_dot_away_from_or_towards_the_centre(zoom, dot, expected):
    x, y = centroid(apply_relation(blob(*dot), 'scaling', zoom))
    assert (x, y) == pytest.approx(expected, abs=0.05)


def test_zoom_out_pads_black_and_zoom_in_matches_resize_then_centre_crop():
    white = np.full((H, W, 3), 255, np.uint8)
    out = apply_relation(white, 'scaling', 0.8)
    # The content shrinks to 0.8 * 101 = 80.8 px wide around x = 50: columns 0..9 are black.
    assert not out[:, :9].any() and not out[:, -9:].any()
    assert (out[30:50, 20:80] == 255).all()
    # Zooming by 1.2 equals cv2.resize to (120, 96) and a centred crop at (10, 8).
    frame = cv2.GaussianBlur(make_frame(100, 80, seed=3), (9, 9), 2.0)
    reference = cv2.resize(frame, (120, 96), interpolation=cv2.INTER_LINEAR)[8:88, 10:110]
    diff = np.abs(apply_relation(frame, 'scaling', 1.2).astype(int) - reference.astype(int))
    assert diff.max() <= 2
    # Zooming by 0.8 equals cv2.resize to (80, 64) pasted at (10, 8) on black (inside the pasted
    # area; on its one-pixel rim the warp blends in the black border).
    padded = np.zeros_like(frame)
    padded[8:72, 10:90] = cv2.resize(frame, (80, 64), interpolation=cv2.INTER_LINEAR)
    out = apply_relation(frame, 'scaling', 0.8)
    assert np.abs(out[9:71, 11:89].astype(int) - padded[9:71, 11:89].astype(int)).max() <= 2
    assert not out[:, :9].any() and not out[:7].any()


def test_clahe_at_clip_one_still_changes_a_low_contrast_frame():
    # 640x480 gives 40x30-pixel tiles, enough pixels per tile for the clip limit to matter.
    yy, xx = np.mgrid[0:480, 0:640]
    low_contrast = np.repeat((100 + (xx + yy) * 20 // (640 + 480)).astype(np.uint8)[..., None], 3, axis=2)
    out = apply_relation(low_contrast, 'histogram_equalization', 1.0)
    assert np.abs(out.astype(int) - low_contrast.astype(int)).mean() > 1.0
    # Equalisation spreads the lightness, and a stronger clip limit spreads it further.
    stronger = apply_relation(low_contrast, 'histogram_equalization', 2.0)
    assert low_contrast[..., 0].std() < out[..., 0].std() < stronger[..., 0].std()
    # The relation works on lightness only: a grey frame stays grey (up to LAB rounding).
    assert (out.max(axis=2) - out.min(axis=2)).max() <= 2


def test_downsampling_by_half_is_nearest_down_and_up():
    # s = 0.5 lies below the Table 2 range, so it goes through the relation's kernel directly:
    # (8, 6) -> (4, 3) -> (8, 6) keeps pixel (2 * (x // 2), 2 * (y // 2)).
    from metavlm_ros.method.relations import _downsample

    frame = np.random.default_rng(1).integers(0, 256, (6, 8, 3), dtype=np.uint8)
    yy, xx = np.mgrid[0:6, 0:8]
    assert np.array_equal(_downsample(frame, 0.5), frame[2 * (yy // 2), 2 * (xx // 2)])


def test_downsampling_inside_the_range_is_nearest_down_and_up():
    frame = np.random.default_rng(1).integers(0, 256, (6, 8, 3), dtype=np.uint8)
    out = apply_relation(frame, 'downsampling', 0.9)
    # (int(7.2), int(5.4)) = (7, 5); nearest down keeps floor(i * 8 / 7), nearest up floor(j * 7 / 8).
    keep_x = (np.arange(7) * 8 // 7)[np.arange(8) * 7 // 8]
    keep_y = (np.arange(5) * 6 // 5)[np.arange(6) * 5 // 6]
    assert keep_x.tolist() == [0, 0, 1, 2, 3, 4, 5, 6] and keep_y.tolist() == [0, 0, 1, 2, 3, 4]
    assert np.array_equal(out, frame[keep_y[:, None], keep_x[None, :]])


def test_shear_moves_x_by_k_times_y_from_the_top_left():
    out = apply_relation(blob(20, 50), 'shear', 0.1)
    assert centroid(out) == pytest.approx((25.0, 50.0), abs=0.05)  # x' = 20 + 0.1 * 50
    # The top row (y = 0) does not move.
    frame = make_frame(W, H, seed=2)
    assert np.array_equal(apply_relation(frame, 'shear', -0.15)[0], frame[0])


@pytest.mark.parametrize(
    ('width', 'p', 'shift'), [(200, 0.03, 6), (200, -0.03, -6), (101, 0.03, 3), (101, -0.025, -2)]
)
def test_translation_shifts_by_int_w_times_p_pixels(width, p, shift):
    frame = make_frame(width, 40, seed=4)
    out = apply_relation(frame, 'translation', p)
    if shift > 0:
        assert np.array_equal(out[:, shift:], frame[:, :-shift]) and not out[:, :shift].any()
    else:
        assert np.array_equal(out[:, :shift], frame[:, -shift:]) and not out[:, shift:].any()


@pytest.mark.parametrize('relation', [r for r in RELATIONS if r.id != 'histogram_equalization'])
def test_nominal_value_is_the_identity(frame, relation):
    out = apply_relation(frame, relation.id, relation.nominal)
    assert np.array_equal(out, frame) and out is not frame


def test_composition_of_nominal_geometry_is_the_identity(frame):
    composition = Composition.from_parameters(
        {'rotation': 0.0, 'scaling': 1.0, 'downsampling': 1.0, 'shear': 0.0, 'translation': 0.0}
    )
    for fuse in (True, False):
        out = apply_composition(frame, composition, fuse=fuse)
        assert np.array_equal(out, frame) and out is not frame
    assert np.array_equal(apply_composition(frame, Composition.identity()), frame)


def test_unfused_composition_is_the_relations_one_after_another(frame):
    params = {
        'rotation': 2.0,
        'scaling': 1.1,
        'histogram_equalization': 1.5,
        'shear': -0.1,
        'translation': 0.02,
    }
    expected = frame
    for name, value in params.items():
        expected = apply_relation(expected, name, value)
    assert np.array_equal(apply_composition(frame, Composition.from_parameters(params), fuse=False), expected)


@pytest.mark.parametrize(
    'params',
    [
        {'rotation': 4.0, 'scaling': 1.2},
        {'shear': 0.12, 'translation': -0.03},
        {'rotation': -3.0, 'scaling': 0.8, 'shear': -0.1, 'translation': 0.02},
        {'rotation': 3.0, 'scaling': 1.1, 'histogram_equalization': 1.5, 'downsampling': 0.95, 'shear': 0.1},
    ],
)
def test_fused_and_sequential_agree_away_from_borders(params):
    frame = cv2.GaussianBlur(make_frame(320, 240, seed=5), (7, 7), 1.5)
    composition = Composition.from_parameters(params)
    fused = apply_composition(frame, composition, fuse=True).astype(int)
    sequential = apply_composition(frame, composition, fuse=False).astype(int)
    inner = (slice(40, 200), slice(60, 260))
    assert np.abs(fused[inner] - sequential[inner]).mean() < 2.0


def test_fusion_transforms_geometry_in_the_fixed_order():
    # Shear then translation: x' = x + 0.1 y + int(101 * 0.03) = 20 + 5 + 3; rotation/scaling first.
    composition = Composition.from_parameters({'scaling': 1.2, 'shear': 0.1, 'translation': 0.03})
    x, y = centroid(apply_composition(blob(40, 45), composition))
    # Scaling about (50, 40): (40, 45) -> (38, 46); shear: 38 + 4.6; translation: + 3.
    assert (x, y) == pytest.approx((38 + 4.6 + 3, 46), abs=0.05)


def test_bad_frames_and_values_raise_typed_errors(frame):
    with pytest.raises(InputError, match='RGB uint8'):
        apply_relation(frame.astype(np.float32), 'rotation', 1.0)
    with pytest.raises(InputError, match='RGB uint8'):
        apply_relation(frame[..., 0], 'rotation', 1.0)
    with pytest.raises(InputError, match='numpy array'):
        apply_relation([[0]], 'rotation', 1.0)
    with pytest.raises(ParameterError, match='unknown relation'):
        apply_relation(frame, 'blur', 1.0)
    with pytest.raises(ParameterError, match=r'rotation angle 7.0 is outside the allowed range \[-5, 5\]'):
        apply_relation(frame, 'rotation', 7.0)
    with pytest.raises(ParameterError, match='downsampling'):
        apply_relation(frame, 'downsampling', float('nan'))


def test_the_input_frame_is_never_modified(frame):
    before = frame.copy()
    composition = Composition.from_parameters(
        {'rotation': 2.0, 'histogram_equalization': 1.3, 'translation': 0.01}
    )
    apply_composition(frame, composition)
    assert np.array_equal(frame, before)


def test_underwater_relations_follow_the_papers_six_in_the_order_of_a_capture():
    assert RELATIONS[:11] == PAPER_RELATIONS + UNDERWATER_RELATIONS
    # Object insertion (§13) comes last: it pastes into the follow-up as the others left it.
    assert RELATIONS == PAPER_RELATIONS + UNDERWATER_RELATIONS + OPTICS_RELATIONS + INSERTION_RELATIONS
    assert DEFAULT_RELATIONS == tuple(r.id for r in PAPER_RELATIONS)
    assert [(r.number, r.id, r.parameter) for r in UNDERWATER_RELATIONS] == [
        (7, 'colour_cast', 'depth'),
        (8, 'turbidity', 'distance'),
        (9, 'marine_snow', 'density'),
        (10, 'motion_blur', 'length'),
        (11, 'low_light', 'stops'),
    ]
    for relation in UNDERWATER_RELATIONS:
        assert relation.nominal == relation.low == 0.0
        assert relation.max_deviation == relation.high - relation.nominal
        assert relation.is_identity(relation.nominal)


def test_underwater_relations_apply_through_the_registry_and_compose_after_the_papers():
    frame = make_frame(96, 64)
    assert np.array_equal(apply_relation(frame, 'turbidity', 0.0), frame)
    with pytest.raises(ParameterError, match='MR8 turbidity distance 6.0 is outside the allowed range'):
        apply_relation(frame, 'turbidity', 6.0)
    composition = Composition.from_parameters({'rotation': 3.0, 'marine_snow': 200.0, 'low_light': 1.0})
    expected = low_light(marine_snow(apply_relation(frame, 'rotation', 3.0), 200.0), 1.0)
    for fuse in (True, False):
        assert np.array_equal(apply_composition(frame, composition, fuse=fuse), expected)


def test_every_relation_carries_how_it_transforms_a_frame():
    """The registry is the relations: each entry brings its function or, if geometric, its matrix."""
    from metavlm_ros.method.relations import Relation

    frame = make_frame(96, 64)
    assert [r.id for r in RELATIONS if r.geometric] == ['rotation', 'scaling', 'shear', 'translation']
    for relation in RELATIONS:
        assert (relation.apply is None) != (relation.matrix is None), relation.name
        assert relation.is_identity(relation.nominal) != relation.changes_at_nominal, relation.name
        if relation.is_identity(relation.nominal):
            assert np.array_equal(apply_relation(frame, relation.id, relation.nominal), frame), relation.name
    with pytest.raises(ValueError, match='exactly one of apply and matrix'):
        Relation(12, 'nothing', 'value', 0.0, 0.0, 1.0, 1.0)


def test_a_geometric_relation_added_to_the_registry_fuses_with_its_neighbours(monkeypatch):
    """A new relation that gives a matrix joins the fused warp without any other change."""
    from metavlm_ros.method import relations as module

    def flip_matrix(amount: float, width: int, height: int) -> np.ndarray:
        return np.array([[1.0, 0.0, float(int(width * amount))], [0.0, 1.0, float(int(height * amount))]])

    extra = module.Relation(12, 'diagonal_shift', 'amount', 0.0, 0.0, 0.1, 0.1, matrix=flip_matrix)
    monkeypatch.setattr(module, 'RELATIONS', module.RELATIONS + (extra,))
    monkeypatch.setitem(module.RELATION_BY_ID, extra.id, extra)
    frame = make_frame(96, 64)
    active = tuple(r.id in ('translation', 'diagonal_shift') for r in module.RELATIONS)
    values = tuple(
        0.03 if r.id == 'translation' else 0.05 if r.id == 'diagonal_shift' else r.nominal
        for r in module.RELATIONS
    )

    class Pair:
        pass

    composition = Pair()
    composition.active, composition.values = active, values
    composition.extras = tuple(r.nominal_extras for r in module.RELATIONS)
    fused = module.apply_composition(frame, composition, fuse=True)
    one_warp = module._warp(
        frame, module._then(module.relation_matrix('translation', 0.03, 96, 64), flip_matrix(0.05, 96, 64))
    )
    assert np.array_equal(fused, one_warp)
    stepwise = module.apply_relation(
        module.apply_relation(frame, 'translation', 0.03), 'diagonal_shift', 0.05
    )
    assert np.array_equal(module.apply_composition(frame, composition, fuse=False), stepwise)


def test_the_searched_angle_reaches_the_motion_blur():
    """Vertical stripes are left as they are by a vertical blur (heave) and smeared by a horizontal one."""
    from metavlm_ros.method.encoding import SearchSpace, decode

    stripes = np.zeros((48, 800, 3), np.uint8)
    stripes[:, ::8] = 255
    space = SearchSpace.from_options(enabled=['motion_blur'])
    vertical = decode(np.array([1.0, 0.01, 90.0]), space)  # 8 px at 800 wide
    horizontal = decode(np.array([1.0, 0.01, 0.0]), space)
    assert np.array_equal(apply_composition(stripes, vertical), stripes)
    assert np.abs(apply_composition(stripes, horizontal).astype(int) - stripes).mean() > 50
    assert np.array_equal(apply_relation(stripes, 'motion_blur', 0.01, 90.0), stripes)
    assert np.array_equal(
        apply_relation(stripes, 'motion_blur', 0.01), apply_composition(stripes, horizontal)
    )
    with pytest.raises(ParameterError, match=r'MR10 motion_blur angle 91.0 is outside'):
        apply_relation(stripes, 'motion_blur', 0.01, 91.0)
    with pytest.raises(ParameterError, match='MR10 motion_blur takes 1 extra values, got 2'):
        apply_relation(stripes, 'motion_blur', 0.01, 0.0, 1.0)


def test_the_composition_matrix_is_the_fused_warps_matrix():
    from metavlm_ros.method import relations

    frame = make_frame(80, 60, seed=4)
    parameters = {'rotation': 3.0, 'scaling': 1.1, 'shear': -0.05, 'translation': 0.02}
    composition = Composition.from_parameters(parameters)
    matrix = relations.composition_matrix(composition, 80, 60)
    # Nothing between the four geometric relations: the fused warp is this one matrix.
    assert np.array_equal(apply_composition(frame, composition, fuse=True), relations._warp(frame, matrix))
    with_clahe = Composition.from_parameters({**parameters, 'histogram_equalization': 1.5})
    assert np.allclose(relations.composition_matrix(with_clahe, 80, 60), matrix)
    assert relations.composition_matrix(Composition.from_parameters({'downsampling': 0.95}), 80, 60) is None
