"""Ground truth of synthetic footage: the kinds per class, counts and boxes per frame, Table 1 captions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from metavlm_ros.method.prediction import CLASSES

__all__ = ['KINDS', 'KIND_CLASS', 'GroundTruth', 'caption']

KINDS: dict[str, tuple[str, ...]] = {
    'animal': ('fish', 'crab', 'starfish', 'jellyfish'),
    'vegetation': ('seaweed', 'seagrass', 'kelp'),
    'object': ('pipe', 'box', 'rov', 'rope', 'anchor'),
    'trash': ('bottle', 'can', 'bag', 'tyre', 'net'),
}
KIND_CLASS = {kind: cls for cls, kinds in KINDS.items() for kind in kinds}
_PLURAL = {
    'box': 'boxes',
    'fish': 'fish',
    'starfish': 'starfish',
    'jellyfish': 'jellyfish',
    'seaweed': 'seaweed',
    'seagrass': 'seagrass',
    'kelp': 'kelp',
    'rov': 'rovs',
}
_CAPTION_HEADS = {'animal': 'Animals', 'vegetation': 'Vegetation', 'object': 'Objects', 'trash': 'Trash'}


@dataclass
class GroundTruth:
    """What a frame shows: visible objects per class and kind, with their boxes.

    Attributes:
        counts: Class -> number of visible objects (every class present, zeros included).
        kind_counts: Kind -> number of visible objects (every kind present, zeros included).
        boxes: One dict per visible object: 'class', 'kind', 'id' (stable across the frames of a
            scene), 'visible' (fraction of the object visible), 'area' (fraction of the frame its
            visible pixels cover) and 'box' [x0, y0, x1, y1] in output pixels, x1 and y1 exclusive,
            of the object's visible pixels.
        frame_index: The frame number in the scene.
        environment: 'pool', 'shallow' or 'deep'.
    """

    counts: dict[str, int]
    kind_counts: dict[str, int]
    boxes: list[dict[str, Any]] = field(default_factory=list)
    frame_index: int = 0
    environment: str = ''

    def to_dict(self) -> dict[str, Any]:
        """The ground truth as plain JSON-serialisable data."""
        return {
            'frame_index': self.frame_index,
            'environment': self.environment,
            'counts': dict(self.counts),
            'kind_counts': dict(self.kind_counts),
            'boxes': [dict(b, box=list(b['box'])) for b in self.boxes],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GroundTruth:
        """Rebuild a GroundTruth from `to_dict` output."""
        return cls(
            counts={k: int(v) for k, v in data['counts'].items()},
            kind_counts={k: int(v) for k, v in data.get('kind_counts', {}).items()},
            boxes=[dict(b, box=[int(v) for v in b['box']]) for b in data.get('boxes', [])],
            frame_index=int(data.get('frame_index', 0)),
            environment=str(data.get('environment', '')),
        )


def caption(gt: GroundTruth) -> str:
    """The Table 1 style caption of a frame, e.g. 'Animals: 2 fish, 1 crab Vegetation: None ...'.

    Kinds are single words ('rov' for an ROV part), plural for counts above one.
    """
    parts = []
    for cls in CLASSES:
        items = []
        for kind in KINDS[cls]:
            n = gt.kind_counts.get(kind, 0)
            if n > 0:
                word = kind if n == 1 else _PLURAL.get(kind, kind + 's')
                items.append(f'{n} {word}')
        parts.append(f'{_CAPTION_HEADS[cls]}: ' + (', '.join(items) if items else 'None'))
    return ' '.join(parts)
