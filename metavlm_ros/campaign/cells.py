"""Campaign images and cells: what a campaign runs, where each committed cell lives, and their checks."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from metavlm_ros.campaign.config import CampaignConfig, FrameSpec, sha256_text
from metavlm_ros.common.directories import sha256_file

__all__ = [
    'CAMPAIGN_FILE',
    'CELLS_DIR',
    'CELL_FILE',
    'CampaignImage',
    'Cell',
    'UNVERIFIED',
    'cell_seed',
    'finished_cells',
    'load_images',
    'plan_cells',
    'read_campaign',
    'safe_name',
    'verify_cell',
]

CAMPAIGN_FILE = 'campaign.json'


CELLS_DIR = 'cells'


CELL_FILE = 'cell.json'


# What verify_cell says of a cell committed before cells carried checksums.
UNVERIFIED = 'unverified'


@dataclass(frozen=True)
class CampaignImage:
    """One source frame of the campaign."""

    index: int
    id: str
    rgb: np.ndarray = field(repr=False, compare=False)
    stamp_ns: int = 0
    #: The file the frame was read from and its position there ('' for generated scenes).
    file: str = ''
    frame_index: int = 0
    #: The frame's range to the scene per pixel (float32 metres, its size, inf = open water) where the
    #: campaign's MR12 takes the footage's ranges (`water_ranges: truth`); None otherwise.
    ranges: np.ndarray | None = field(default=None, repr=False, compare=False)

    @property
    def sha256(self) -> str:
        """A hash of the pixels and shape: changed footage changes it."""
        from metavlm_ros.footage.frames import frame_digest

        return frame_digest(self.rgb)

    @property
    def ranges_sha256(self) -> str | None:
        """A hash of the range map in millimetres, as a search stores it (None: no map)."""
        from metavlm_ros.common.range_maps import ranges_digest

        return None if self.ranges is None else ranges_digest(self.ranges)


def load_images(frames: FrameSpec, water_ranges: str = 'prior') -> list[CampaignImage]:
    """Read (or generate) every frame of a campaign, with unique file-safe ids; with `water_ranges`
    'truth', each with its range map (the footage's ranges/<frame>.png or bag message, or the scene's
    own), shrunk with its frame.

    Raises:
        InputError: A source cannot be read, no frame was selected, or (ranges 'truth') a frame has no
            range map: one line naming the first, before any cell runs.
        ParameterError: The selection is invalid.
    """
    from metavlm_ros.common.errors import InputError
    from metavlm_ros.common.images import resize_longer_side
    from metavlm_ros.footage.frames import iter_frames, verify_sources

    truth = water_ranges == 'truth'
    items: list[tuple[str, np.ndarray, int, str, int, np.ndarray | None]] = []
    if frames.generate is not None:
        for name, rgb, ranges in _generate_scenes(frames.generate, truth):
            items.append((name, rgb, 0, '', 0, ranges))
            if frames.max_frames is not None and len(items) >= frames.max_frames:
                break
    else:
        from metavlm_ros.footage.ranges import RangeLookup, missing_ranges

        lookup = RangeLookup()
        verify_sources(list(frames.sources))  # bags whole, against their checksums
        for frame in iter_frames(
            list(frames.sources),
            topic=frames.topic,
            every=frames.every,
            start=frames.start,
            end=frames.end,
            max_frames=frames.max_frames,
        ):
            ranges = lookup(frame) if truth else None
            if truth and ranges is None:
                raise missing_ranges(frame, lookup)
            items.append((frame.id, frame.rgb, frame.stamp_ns, frame.file, frame.index, ranges))
    if not items:
        raise InputError('frames: the selection holds no frames')
    images: list[CampaignImage] = []
    used: set[str] = set()
    for index, (name, rgb, stamp, file, position, ranges) in enumerate(items):
        safe = safe_name(name)
        unique, n = safe, 2
        while unique in used:
            unique, n = f'{safe}-{n}', n + 1
        used.add(unique)
        rgb = resize_longer_side(rgb, frames.size) if frames.size else rgb
        rgb = np.ascontiguousarray(rgb)
        images.append(
            CampaignImage(
                index,
                unique,
                rgb,
                stamp_ns=stamp,
                file=file,
                frame_index=position,
                ranges=_sized(ranges, rgb),
            )
        )
    return images


def _sized(ranges: np.ndarray | None, rgb: np.ndarray) -> np.ndarray | None:
    """A range map at its (shrunk) frame's size: nearest neighbour, so that every pixel keeps a range
    some surface has (a blend of an object's and the floor's is neither)."""
    if ranges is None or ranges.shape == rgb.shape[:2]:
        return ranges
    import cv2

    return cv2.resize(ranges, (rgb.shape[1], rgb.shape[0]), interpolation=cv2.INTER_NEAREST)


def _generate_scenes(
    spec: Mapping, ranges: bool = False
) -> Iterator[tuple[str, np.ndarray, np.ndarray | None]]:
    """Synthetic scenes from core.scenes: scene i is the first frame of the scene seeded seed + i, with
    its range map from the same render where `ranges`."""
    from metavlm_ros.footage.scenes import SceneGenerator

    width, height = spec['size']
    for i in range(spec['count']):
        # One scene per image (not frames of one scene): campaigns want varied environments and objects.
        generator = SceneGenerator(width=width, height=height, seed=spec['seed'] + i)
        if ranges:
            from metavlm_ros.footage.ranges import render_with_ranges

            rgb, _, scene_ranges = render_with_ranges(generator, 0)
        else:
            (rgb, _), scene_ranges = generator.frame(0), None
        yield f'scene-{spec["seed"] + i:03d}', np.ascontiguousarray(rgb), scene_ranges


def safe_name(name: str) -> str:
    safe = ''.join(c if c.isalnum() or c in '-_.@' else '_' for c in str(name)).strip('.')
    return safe or 'frame'


def cell_seed(base_seed: int, model_index: int, run: int) -> int:
    """The search seed of a run: derived from the base seed, the model and the run number.

    NSGA-II and random search of the same run share it, as the paper's paired runs do.
    """
    sequence = np.random.SeedSequence(base_seed, spawn_key=(model_index, run))
    return int(sequence.generate_state(1, dtype=np.uint32)[0])


@dataclass(frozen=True)
class Cell:
    """One unit of work: a search of one image by one algorithm with one model, in one run."""

    id: str
    model_index: int
    model: str
    algorithm: str
    run: int
    image_index: int
    image: str
    seed: int


def plan_cells(config: CampaignConfig, images: Sequence[CampaignImage]) -> list[Cell]:
    """Every cell of the campaign, in a fixed order (model, run, image, algorithm)."""
    cells = []
    for m, spec in enumerate(config.models):
        for run in range(config.runs):
            seed = cell_seed(config.seed, m, run)
            for image in images:
                for algorithm in config.algorithms:
                    cell_id = f'm{m}-{algorithm}-r{run:03d}-{image.id}'
                    cells.append(Cell(cell_id, m, spec.name, algorithm, run, image.index, image.id, seed))
    return cells


def verify_cell(cell_dir: str | Path) -> str | None:
    """What is wrong with a committed cell, checked against the checksums written with it; None if whole.

    cell.json carries the sha256 of every file of the cell and of its own content: a file that was
    truncated, garbled, removed or added since the commit is named. Cells committed before
    checksums existed (no 'files' in cell.json) give 'unverified'.
    """
    cell_dir = Path(cell_dir)
    try:
        info = json.loads((cell_dir / CELL_FILE).read_text(encoding='utf-8'))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return f'{CELL_FILE} unreadable ({type(exc).__name__})'
    if not isinstance(info, dict):
        return f'{CELL_FILE} is not a cell record'
    files = info.get('files')
    if files is None:
        return UNVERIFIED
    expected = info.get('checksum')
    if expected != sha256_text(
        json.dumps({k: v for k, v in info.items() if k != 'checksum'}, sort_keys=True)
    ):
        return f'{CELL_FILE} does not match its checksum'
    present = {str(p.relative_to(cell_dir)) for p in cell_dir.rglob('*') if p.is_file()} - {CELL_FILE}
    for name in sorted(present - set(files)):
        return f'{name} was not part of the cell'
    for name, digest in sorted(files.items()):
        path = cell_dir / name
        if not path.is_file():
            return f'{name} is missing'
        if sha256_file(path) != digest:
            return f'{name} does not match its checksum'
    return None


def finished_cells(directory: str | Path) -> set[str]:
    """Ids of the committed cells under `directory` (a cell exists once its folder was renamed in)."""
    cells_dir = Path(directory) / CELLS_DIR
    if not cells_dir.is_dir():
        return set()
    return {p.name for p in cells_dir.iterdir() if p.is_dir() and not p.name.startswith('.')}


def read_campaign(directory: str | Path) -> dict:
    """The campaign record (campaign.json) of a results directory.

    Raises:
        InputError: The directory is not a campaign results directory.
    """
    from metavlm_ros.common.errors import InputError

    path = Path(directory) / CAMPAIGN_FILE
    if not path.is_file():
        raise InputError(f'{directory}: not a campaign results directory (no {CAMPAIGN_FILE})')
    try:
        record = json.loads(path.read_text(encoding='utf-8'))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f'{path}: unreadable campaign record ({exc})') from None
    if not isinstance(record, dict):
        raise InputError(
            f'{path}: unreadable campaign record (a JSON {type(record).__name__}, not a mapping)'
        )
    return record
