"""Object sprites of synthetic scenes: each kind drawn with cv2 primitives in metres around an anchor.

SPRITES is the table of kinds: how each is drawn, its size range, its pose and how far its drawing
reaches, and the look drawn at random for each object (colours, proportions, details).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from metavlm_ros.footage.drawing import (
    Pen,
    draw_anchor,
    draw_bag,
    draw_bottle,
    draw_box,
    draw_can,
    draw_crab,
    draw_fish,
    draw_jellyfish,
    draw_kelp,
    draw_net,
    draw_pipe,
    draw_rope,
    draw_rov,
    draw_seagrass,
    draw_seaweed,
    draw_starfish,
    draw_tyre,
)

__all__ = [
    'Pen',
    'Pick',
    'SPRITES',
    'Sprite',
    'random_params',
]


# The look of each kind, drawn at random per object; `pick` chooses one of a list with the same rng.
# Each function draws from the rng in the order its keys are listed.
Pick = Callable[[list], Any]


def _fish_look(pick: Pick, rng: np.random.Generator) -> dict:
    return dict(
        colour=pick(
            [(190, 190, 175), (220, 170, 60), (120, 140, 160), (200, 90, 60), (160, 160, 120), (230, 210, 90)]
        ),
        aspect=float(rng.uniform(0.14, 0.24)),
        beat=float(rng.uniform(5, 9)),
        stripes=int(rng.integers(0, 4)),
    )


def _colour_look(*colours: tuple[int, int, int]) -> Callable[[Pick, np.random.Generator], dict]:
    def look(pick: Pick, rng: np.random.Generator) -> dict:
        return {'colour': pick(list(colours))}

    return look


def _plant_look(colours: list, strands: tuple[int, int]) -> Callable[[Pick, np.random.Generator], dict]:
    def look(pick: Pick, rng: np.random.Generator) -> dict:
        return dict(
            colour=pick(colours),
            strands=int(rng.integers(*strands)),
            sway_speed=float(rng.uniform(0.6, 1.2)),
            lean=float(rng.uniform(-0.6, 0.6)),
        )

    return look


def _bottle_look(pick: Pick, rng: np.random.Generator) -> dict:
    glass = pick(
        [((60, 120, 60), 0.8), ((110, 70, 30), 0.85), ((170, 200, 200), 0.7), ((80, 140, 190), 0.75)]
    )
    return dict(
        colour=glass[0],
        opacity=glass[1],
        label=bool(rng.random() < 0.5),
        label_colour=pick([(220, 220, 210), (200, 50, 40), (40, 80, 170)]),
        cap=pick([(30, 90, 180), (200, 40, 40), (230, 230, 230)]),
    )


def _can_look(pick: Pick, rng: np.random.Generator) -> dict:
    return dict(
        colour=pick([(200, 40, 40), (190, 190, 195), (40, 90, 180), (40, 130, 60), (220, 200, 60)]),
        stripe=pick([(240, 240, 240), (30, 30, 30), (220, 180, 40)]),
        dent=float(rng.uniform(0, 0.35)),
    )


def _bag_look(pick: Pick, rng: np.random.Generator) -> dict:
    n = 18
    return dict(
        colour=pick([(225, 230, 230), (210, 220, 200), (60, 60, 65), (180, 40, 40), (40, 90, 170)]),
        opacity=float(rng.uniform(0.7, 0.85)),
        radii=[float(v) for v in np.clip(1 + 0.25 * rng.standard_normal(n), 0.6, 1.3)],
    )


def _net_look(pick: Pick, rng: np.random.Generator) -> dict:
    a = np.linspace(0, 2 * math.pi, 14, endpoint=False)
    r = np.clip(1 + 0.2 * rng.standard_normal(14), 0.7, 1.2)
    return dict(
        colour=pick([(60, 140, 90), (40, 90, 160), (200, 110, 40), (150, 150, 140)]),
        outline=np.stack([r * np.cos(a), r * np.sin(a) * 0.7], 1).tolist(),
        floats=[(float(x), float(y)) for x, y in rng.uniform(-1, 1, (int(rng.integers(0, 4)), 2))],
        float_colour=pick([(230, 120, 30), (230, 220, 40), (240, 240, 240)]),
    )


def _pipe_look(pick: Pick, rng: np.random.Generator) -> dict:
    return dict(
        colour=pick([(140, 140, 140), (210, 110, 40), (60, 60, 60), (200, 200, 190)]),
        aspect=float(rng.uniform(0.05, 0.1)),
        rust=[
            (float(x), float(w))
            for x, w in zip(rng.uniform(-0.8, 0.8, 3), rng.uniform(0.03, 0.1, 3), strict=True)
        ],
    )


def _box_look(pick: Pick, rng: np.random.Generator) -> dict:
    return dict(
        colour=pick([(150, 110, 65), (120, 90, 55), (200, 180, 60), (90, 100, 110)]),
        aspect=float(rng.uniform(0.55, 0.9)),
        planks=int(rng.integers(2, 6)),
    )


def _rope_look(pick: Pick, rng: np.random.Generator) -> dict:
    n = 12
    x = np.linspace(-0.5, 0.5, n)
    y = np.cumsum(rng.normal(0, 0.06, n))
    y -= y.mean()
    return dict(
        colour=pick([(210, 190, 140), (230, 150, 50), (60, 110, 190), (200, 60, 50)]),
        path=np.stack([x, y], 1).tolist(),
    )


@dataclass(frozen=True)
class Sprite:
    """One kind of object as scenes draw it."""

    draw: Callable[[Pen, dict, float], None]
    #: Size range in metres.
    size: tuple[float, float]
    #: 'upright' (anchored at its bottom centre on the floor), 'swimmer' (in open water) or 'lying'.
    pose: str
    #: The object's random look: (pick, rng) -> parameters of `draw`.
    look: Callable[[Pick, np.random.Generator], dict]
    #: How far the drawing reaches around its anchor, in units of size.
    extent: float = 0.9


#: The table of kinds (footage/truth.py KINDS names them by class).
SPRITES: dict[str, Sprite] = {
    'fish': Sprite(draw_fish, (0.18, 0.5), 'swimmer', _fish_look),
    'crab': Sprite(
        draw_crab, (0.15, 0.3), 'lying', _colour_look((200, 80, 45), (150, 90, 60), (180, 120, 70))
    ),
    'starfish': Sprite(
        draw_starfish,
        (0.15, 0.3),
        'lying',
        _colour_look((225, 95, 45), (200, 60, 60), (150, 70, 140), (230, 150, 60)),
    ),
    'jellyfish': Sprite(
        draw_jellyfish,
        (0.15, 0.35),
        'swimmer',
        _colour_look((230, 210, 230), (220, 220, 240), (240, 190, 170)),
    ),
    'seaweed': Sprite(
        draw_seaweed,
        (0.3, 0.7),
        'upright',
        _plant_look([(95, 110, 45), (120, 100, 40), (70, 120, 60)], (3, 7)),
        extent=1.3,
    ),
    'seagrass': Sprite(
        draw_seagrass,
        (0.2, 0.45),
        'upright',
        _plant_look([(90, 150, 60), (110, 160, 70), (70, 130, 55)], (10, 22)),
        extent=1.3,
    ),
    'kelp': Sprite(
        draw_kelp,
        (0.9, 2.0),
        'upright',
        _plant_look([(150, 120, 45), (130, 105, 40), (165, 135, 60)], (1, 4)),
        extent=1.3,
    ),
    'bottle': Sprite(draw_bottle, (0.24, 0.34), 'lying', _bottle_look),
    'can': Sprite(draw_can, (0.11, 0.15), 'lying', _can_look),
    'bag': Sprite(draw_bag, (0.3, 0.5), 'lying', _bag_look),
    'tyre': Sprite(draw_tyre, (0.5, 0.75), 'lying', lambda pick, rng: {}),
    'net': Sprite(draw_net, (0.8, 1.4), 'lying', _net_look, extent=0.8),
    'pipe': Sprite(draw_pipe, (0.9, 2.2), 'lying', _pipe_look, extent=0.75),
    'box': Sprite(draw_box, (0.35, 0.7), 'upright', _box_look),
    'rov': Sprite(
        draw_rov, (0.45, 0.8), 'upright', _colour_look((235, 190, 30), (230, 120, 30), (220, 220, 40))
    ),
    'rope': Sprite(draw_rope, (0.8, 1.6), 'lying', _rope_look, extent=0.8),
    'anchor': Sprite(
        draw_anchor, (0.5, 0.9), 'lying', _colour_look((80, 70, 62), (110, 75, 50), (60, 62, 66))
    ),
}


def random_params(kind: str, rng: np.random.Generator) -> dict:
    """An object's size, animation phase and look, drawn from `rng` (the scene's, in object order)."""
    sprite = SPRITES[kind]
    p: dict[str, Any] = {
        'size': float(rng.uniform(*sprite.size)),
        'phase': float(rng.uniform(0, 2 * math.pi)),
    }

    def pick(options: list) -> Any:
        return options[int(rng.integers(len(options)))]

    p.update(sprite.look(pick, rng))
    return p
