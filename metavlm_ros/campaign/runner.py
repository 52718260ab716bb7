"""Campaigns: every (model, algorithm, run, image) search run as a resumable cell, locally or on Dask."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import math
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from metavlm_ros import __version__
from metavlm_ros.core.errors import MetaVLMError, ParameterError
from metavlm_ros.core.results import check_output_dir, storage_error

__all__ = [
    'ALGORITHMS',
    'BACKENDS',
    'CAMPAIGN_FILE',
    'CELLS_DIR',
    'CELL_FILE',
    'EXECUTORS',
    'CampaignConfig',
    'CampaignImage',
    'CampaignRun',
    'Cell',
    'CellOutcome',
    'CellTask',
    'FrameSpec',
    'ModelSpec',
    'cell_seed',
    'commit_cell',
    'finished_cells',
    'verify_cell',
    'load_config',
    'load_images',
    'parse_config',
    'plan_cells',
    'run_campaign',
    'run_cell',
    'task_resources',
]

ALGORITHMS = ('nsga2', 'random')
BACKENDS = ('clip', 'blip', 'instructblip')
EXECUTORS = ('local', 'dask')
CAMPAIGN_FILE = 'campaign.json'
CELLS_DIR = 'cells'
CELL_FILE = 'cell.json'
# What verify_cell says of a cell committed before cells carried checksums.
UNVERIFIED = 'unverified'
# Scratch folders of running cells in $TMPDIR: .metavlm-cell-<host>.partial-<pid>-<token>.
SCRATCH_PREFIX = 'metavlm-cell-'
FRAMES_DIR = 'frames'
LOCK_FILE = '.lock'
FORMAT = 1

_TOP_KEYS = {
    'frames',
    'models',
    'algorithms',
    'runs',
    'population',
    'evaluations',
    'seed',
    'thresholds',
    'working_size',
    'relations',
    'warp',
    'threads',
}
_FRAME_KEYS = {'sources', 'topic', 'every', 'start', 'end', 'max_frames', 'size', 'generate'}
_GENERATE_KEYS = {'count', 'size', 'seed'}
_MODEL_KEYS = {
    'name',
    'backend',
    'model',
    'classes',
    'class_prompts',
    'prompts',
    'prompt',
    'confidence',
    'device',
    'dtype',
    'batch_size',
    'vocabularies',
}
_RELATION_KEYS = {'enabled', 'ranges'}


# ---------------------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True)
class FrameSpec:
    """Where a campaign's images come from: files, folders or bags, or generated scenes."""

    sources: tuple[str, ...] = ()
    topic: str | None = None
    every: int = 1
    start: float | None = None
    end: float | None = None
    max_frames: int | None = None
    size: int | None = None
    generate: dict | None = None


@dataclass(frozen=True)
class ModelSpec:
    """One model under test, with everything `create_backend` needs."""

    name: str
    backend: str
    model: str
    classes: tuple[str, ...] | None = None
    class_prompts: dict | None = None
    prompts: str = 'default'
    prompt: str | None = None
    confidence: str = 'cosine'
    device: str = 'auto'
    dtype: str = 'auto'
    batch_size: int = 32
    vocabularies: dict | None = None

    @property
    def needs_gpu(self) -> bool:
        """Whether cells of this model must run on a worker that offers a GPU."""
        return self.device.startswith('cuda')

    def key(self) -> str:
        """A stable text key: equal keys build identical backends."""
        return json.dumps(asdict(self), sort_keys=True)


@dataclass(frozen=True)
class CampaignConfig:
    """A validated campaign: frames, models, algorithms, runs, budget and base seed."""

    frames: FrameSpec
    models: tuple[ModelSpec, ...]
    algorithms: tuple[str, ...] = ALGORITHMS
    runs: int = 10
    population: int = 30
    evaluations: int = 3000
    seed: int = 0
    thresholds: tuple[float, ...] = (0.01, 0.03, 0.05)
    working_size: int | None = None
    relations: dict | None = None
    # Campaigns reproduce the paper, which resamples after every relation (docs/method.md §8).
    warp: str = 'sequential'
    # Torch threads per cell, whatever the executor: float sums (and so the tables) depend on it.
    threads: int = 1

    def to_dict(self) -> dict:
        """The normalised configuration (every default filled in) as plain JSON values."""
        return json.loads(json.dumps(asdict(self)))

    def fingerprint(self) -> str:
        """A short hash of the normalised configuration."""
        return _sha256_text(json.dumps(self.to_dict(), sort_keys=True))[:16]

    def search_config(self, algorithm: str, seed: int):
        """The SearchConfig of one cell."""
        from metavlm_ros.core.search import SearchConfig

        return SearchConfig(
            algorithm=algorithm,
            population=self.population,
            evaluations=self.evaluations,
            seed=seed,
            space=_search_space(self.relations),
            thresholds=tuple(self.thresholds),
            working_size=self.working_size,
            warp=self.warp,
        )


def _search_space(relations: Mapping | None):
    from metavlm_ros.core.encoding import SearchSpace

    if not relations:
        return SearchSpace.default()
    ranges = relations.get('ranges')
    return SearchSpace.from_options(
        enabled=relations.get('enabled'),
        ranges={k: tuple(v) for k, v in ranges.items()} if ranges else None,
    )


def load_config(path: str | Path) -> CampaignConfig:
    """Read and validate a campaign YAML file; relative paths in it are relative to the file.

    Raises:
        ParameterError: The file is missing or not YAML, or the configuration has problems; the
            message lists every problem with its location.
    """
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ParameterError(f'{path}: no such campaign config file')
    try:
        data = yaml.safe_load(path.read_text(encoding='utf-8'))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ParameterError(f'{path}: not valid YAML ({first})') from None
    return parse_config(data, base_dir=path.parent, source=str(path))


class _Problems:
    """Collects configuration problems so that all of them are reported at once."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, where: str, message: str) -> None:
        self.items.append(f'{where}: {message}')

    def unknown_keys(self, where: str, data: Mapping, allowed: set[str]) -> None:
        for key in data:
            if key not in allowed:
                prefix = f'{where}.' if where else ''
                self.add(f'{prefix}{key}', f'unknown key (allowed: {", ".join(sorted(allowed))})')

    def integer(self, where: str, value: Any, low: int, default: int | None = None) -> int | None:
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            self.add(where, f'must be an integer, got {value!r}')
            return default
        if value < low:
            self.add(where, f'must be >= {low}, got {value}')
            return default
        return value

    def number(self, where: str, value: Any, low: float | None = None) -> float | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            self.add(where, f'must be a number, got {value!r}')
            return None
        if low is not None and value < low:
            self.add(where, f'must be >= {low}, got {value}')
            return None
        return float(value)

    def string(self, where: str, value: Any, required: bool = False) -> str | None:
        if value is None:
            if required:
                self.add(where, 'is required')
            return None
        if not isinstance(value, str) or not value.strip():
            self.add(where, f'must be a non-empty string, got {value!r}')
            return None
        return value


def parse_config(data: Any, *, base_dir: str | Path = '.', source: str = 'config') -> CampaignConfig:
    """Validate a campaign configuration mapping (as read from YAML).

    Args:
        data: The mapping.
        base_dir: The folder that relative frame and model paths are relative to.
        source: Names the configuration in the error message.

    Returns:
        The validated configuration, with paths made absolute.

    Raises:
        ParameterError: One message listing every problem, each with its location.
    """
    base_dir = Path(base_dir)
    problems = _Problems()
    if not isinstance(data, Mapping):
        raise ParameterError(f'{source}: a campaign config must be a mapping, got {type(data).__name__}')
    problems.unknown_keys('', data, _TOP_KEYS)

    frames = _parse_frames(data.get('frames'), base_dir, problems)
    models = _parse_models(data.get('models'), base_dir, problems)

    algorithms: tuple[str, ...] = ALGORITHMS
    raw_algorithms = data.get('algorithms')
    if raw_algorithms is not None:
        if isinstance(raw_algorithms, str):
            raw_algorithms = [raw_algorithms]
        if not isinstance(raw_algorithms, list) or not raw_algorithms:
            problems.add('algorithms', f'must be a non-empty list, got {raw_algorithms!r}')
        else:
            for i, name in enumerate(raw_algorithms):
                if name not in ALGORITHMS:
                    choices = ', '.join(ALGORITHMS)
                    problems.add(f'algorithms[{i}]', f'unknown algorithm "{name}" (choose from {choices})')
            if len(set(map(str, raw_algorithms))) != len(raw_algorithms):
                problems.add('algorithms', 'lists an algorithm twice')
            algorithms = tuple(str(a) for a in raw_algorithms)

    runs = problems.integer('runs', data.get('runs'), 1, 10)
    population = problems.integer('population', data.get('population'), 2, 30)
    evaluations = problems.integer('evaluations', data.get('evaluations'), 1, 3000)
    seed = problems.integer('seed', data.get('seed'), 0, 0)
    working_size = problems.integer('working_size', data.get('working_size'), 8, None)
    threads = problems.integer('threads', data.get('threads'), 1, 1)
    from metavlm_ros.core.relations import WARPS

    warp = data.get('warp', 'sequential')
    if warp not in WARPS:
        problems.add('warp', f'must be one of {", ".join(WARPS)}, got {warp!r}')

    thresholds: tuple[float, ...] = (0.01, 0.03, 0.05)
    raw_thresholds = data.get('thresholds')
    if raw_thresholds is not None:
        if not isinstance(raw_thresholds, list) or not raw_thresholds:
            problems.add('thresholds', f'must be a non-empty list of numbers, got {raw_thresholds!r}')
        else:
            values = []
            for i, value in enumerate(raw_thresholds):
                number = problems.number(f'thresholds[{i}]', value)
                if number is not None and not 0 < number < 1:
                    problems.add(f'thresholds[{i}]', f'must lie in (0, 1), got {value}')
                elif number is not None:
                    values.append(number)
            thresholds = tuple(values)

    relations = data.get('relations')
    if relations is not None:
        if not isinstance(relations, Mapping):
            problems.add('relations', f'must be a mapping with enabled and ranges, got {relations!r}')
            relations = None
        else:
            problems.unknown_keys('relations', relations, _RELATION_KEYS)
            relations = {k: relations[k] for k in sorted(_RELATION_KEYS) if relations.get(k) is not None}
            ranges = relations.get('ranges', {})
            if not isinstance(ranges, Mapping):
                problems.add('relations.ranges', f'must map relation id -> [low, high], got {ranges!r}')
                relations.pop('ranges')
            else:
                for rid, pair in list(ranges.items()):
                    if not (
                        isinstance(pair, list)
                        and len(pair) == 2
                        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in pair)
                    ):
                        problems.add(f'relations.ranges.{rid}', f'must be [low, high], got {pair!r}')
                        relations['ranges'] = {k: v for k, v in ranges.items() if k != rid}
                        ranges = relations['ranges']
            enabled = relations.get('enabled')
            if enabled is not None and (
                not isinstance(enabled, list) or not all(isinstance(e, str) for e in enabled)
            ):
                problems.add('relations.enabled', f'must be a list of relation ids, got {enabled!r}')
                relations.pop('enabled')
            try:
                _search_space(relations)
            except MetaVLMError as exc:
                problems.add('relations', str(exc))
            except (TypeError, ValueError, AttributeError) as exc:
                problems.add('relations', f'invalid ({exc})')

    if problems.items:
        count = len(problems.items)
        raise ParameterError(
            f'{source}: {count} problem{"s" if count > 1 else ""}: ' + '; '.join(problems.items)
        )
    return CampaignConfig(
        frames=frames,
        models=tuple(models),
        algorithms=algorithms,
        runs=runs,
        population=population,
        evaluations=evaluations,
        seed=seed,
        thresholds=thresholds,
        working_size=working_size,
        relations=relations or None,
        warp=str(warp),
        threads=threads,
    )


def _parse_frames(raw: Any, base_dir: Path, problems: _Problems) -> FrameSpec:
    if raw is None:
        problems.add('frames', 'is required (a list of images, folders or bags, or {generate: ...})')
        return FrameSpec()
    if isinstance(raw, (str, list)):
        raw = {'sources': raw}
    if not isinstance(raw, Mapping):
        problems.add('frames', f'must be a list of paths or a mapping, got {raw!r}')
        return FrameSpec()
    problems.unknown_keys('frames', raw, _FRAME_KEYS)
    every = problems.integer('frames.every', raw.get('every'), 1, 1)
    start = problems.number('frames.start', raw.get('start'), 0)
    end = problems.number('frames.end', raw.get('end'), 0)
    if start is not None and end is not None and end < start:
        problems.add('frames.end', f'must not be before frames.start ({start}), got {end}')
    max_frames = problems.integer('frames.max_frames', raw.get('max_frames'), 1, None)
    size = problems.integer('frames.size', raw.get('size'), 8, None)
    topic = problems.string('frames.topic', raw.get('topic'))

    generate = raw.get('generate')
    sources = raw.get('sources')
    if generate is not None and sources is not None:
        problems.add('frames', 'give either sources or generate, not both')
    if generate is None and sources is None:
        problems.add('frames', 'needs sources (images, folders or bags) or generate')
    if generate is not None:
        return FrameSpec(generate=_parse_generate(generate, problems), max_frames=max_frames, size=size)

    if isinstance(sources, str):
        sources = [sources]
    resolved: list[str] = []
    if not isinstance(sources, list) or not sources:
        if sources is not None:
            problems.add('frames.sources', f'must be a non-empty list of paths, got {sources!r}')
    else:
        for i, item in enumerate(sources):
            if not isinstance(item, str) or not item:
                problems.add(f'frames.sources[{i}]', f'must be a path, got {item!r}')
                continue
            path = Path(item).expanduser()
            path = path if path.is_absolute() else base_dir / path
            if not path.exists():
                problems.add(f'frames.sources[{i}]', f'no such file or directory: {path}')
            resolved.append(str(path.resolve()))
    return FrameSpec(
        sources=tuple(resolved),
        topic=topic,
        every=every,
        start=start,
        end=end,
        max_frames=max_frames,
        size=size,
    )


def _parse_generate(raw: Any, problems: _Problems) -> dict:
    if not isinstance(raw, Mapping):
        problems.add('frames.generate', f'must be a mapping with count, size, seed; got {raw!r}')
        return {}
    problems.unknown_keys('frames.generate', raw, _GENERATE_KEYS)
    count = problems.integer('frames.generate.count', raw.get('count'), 1, 4)
    seed = problems.integer('frames.generate.seed', raw.get('seed'), 0, 0)
    size = raw.get('size', [160, 120])
    if isinstance(size, int) and not isinstance(size, bool):
        size = [size, size]
    if (
        not isinstance(size, list)
        or len(size) != 2
        or any(isinstance(v, bool) or not isinstance(v, int) or v < 16 for v in size)
    ):
        problems.add('frames.generate.size', f'must be [width, height] with both >= 16, got {size!r}')
        size = [160, 120]
    return {'count': count, 'size': list(size), 'seed': seed}


def _parse_models(raw: Any, base_dir: Path, problems: _Problems) -> list[ModelSpec]:
    if raw is None:
        problems.add('models', 'is required (a list of {backend, model, ...})')
        return []
    if not isinstance(raw, list) or not raw:
        problems.add('models', f'must be a non-empty list, got {raw!r}')
        return []
    models: list[ModelSpec] = []
    names: set[str] = set()
    for i, item in enumerate(raw):
        where = f'models[{i}]'
        if not isinstance(item, Mapping):
            problems.add(where, f'must be a mapping with backend and model, got {item!r}')
            continue
        problems.unknown_keys(where, item, _MODEL_KEYS)
        backend = problems.string(f'{where}.backend', item.get('backend'), required=True)
        if backend is not None and backend not in BACKENDS:
            choices = ', '.join(BACKENDS)
            problems.add(f'{where}.backend', f'unknown backend "{backend}" (choose from {choices})')
        model = problems.string(f'{where}.model', item.get('model'), required=True)
        if model is not None:
            model = _resolve_model(model, backend, base_dir, f'{where}.model', problems)
        classes = item.get('classes')
        if classes is not None:
            if (
                not isinstance(classes, list)
                or not classes
                or any(not isinstance(c, str) or not c for c in classes)
                or len(set(classes)) != len(classes)
            ):
                problems.add(f'{where}.classes', f'must be a list of distinct class names, got {classes!r}')
                classes = None
            else:
                classes = tuple(classes)
        class_prompts = item.get('class_prompts')
        if class_prompts is not None:
            known = set(classes or ('animal', 'vegetation', 'object', 'trash'))
            if not isinstance(class_prompts, Mapping):
                problems.add(f'{where}.class_prompts', f'must map class -> prompt, got {class_prompts!r}')
                class_prompts = None
            else:
                for key, text in class_prompts.items():
                    if key not in known:
                        problems.add(f'{where}.class_prompts.{key}', 'is not one of the classes')
                    elif not isinstance(text, str) or not text:
                        message = f'must be a non-empty string, got {text!r}'
                        problems.add(f'{where}.class_prompts.{key}', message)
                class_prompts = dict(class_prompts)
        vocabularies = item.get('vocabularies')
        if vocabularies is not None and not isinstance(vocabularies, Mapping):
            problems.add(f'{where}.vocabularies', f'must map class -> list of words, got {vocabularies!r}')
            vocabularies = None
        prompt = problems.string(f'{where}.prompt', item.get('prompt'))
        from metavlm_ros.core.vlm import PROMPT_PRESETS

        prompts = item.get('prompts', 'default')
        if prompts not in PROMPT_PRESETS:
            problems.add(f'{where}.prompts', f'must be one of {", ".join(PROMPT_PRESETS)}, got {prompts!r}')
        elif prompts != 'default' and backend != 'clip':
            problems.add(f'{where}.prompts', 'prompt presets are for clip models (count models take prompt)')
        confidence = item.get('confidence', 'cosine')
        if confidence not in ('cosine', 'softmax'):
            problems.add(f'{where}.confidence', f'must be cosine or softmax, got {confidence!r}')
        device = problems.string(f'{where}.device', item.get('device')) or 'auto'
        dtype = problems.string(f'{where}.dtype', item.get('dtype')) or 'auto'
        batch_size = problems.integer(f'{where}.batch_size', item.get('batch_size'), 1, 32)
        name = problems.string(f'{where}.name', item.get('name'))
        if name is None:
            name = f'{backend}:{Path(model or "model").name}'
        if name in names:
            if item.get('name') is not None:
                problems.add(f'{where}.name', f'"{name}" is used by another model')
            name = f'{name}#{i}'
        names.add(name)
        models.append(
            ModelSpec(
                name=name,
                backend=backend or '',
                model=model or '',
                classes=classes,
                class_prompts=class_prompts,
                prompts=str(prompts),
                prompt=prompt,
                confidence=str(confidence),
                device=device,
                dtype=dtype,
                batch_size=batch_size,
                vocabularies=dict(vocabularies) if vocabularies else None,
            )
        )
    return models


def _resolve_model(model: str, backend: str | None, base_dir: Path, where: str, problems: _Problems) -> str:
    """A model is a directory (relative to the config file), a cached Hugging Face id, or 'demo'."""
    from metavlm_ros.core.errors import ModelError
    from metavlm_ros.core.vlm import resolve_model

    path = Path(model).expanduser()
    candidate = path if path.is_absolute() else base_dir / path
    if candidate.exists():
        model = str(candidate.resolve())
    elif path.is_absolute() or model.startswith(('.', '~')):
        problems.add(where, f'no such model directory: {candidate}')
        return model
    if backend in BACKENDS:
        try:
            resolve_model(backend, model)
        except ModelError as exc:
            problems.add(where, str(exc))
    return model


# ---------------------------------------------------------------------------------------------------
# Images and cells


@dataclass(frozen=True)
class CampaignImage:
    """One source frame of the campaign."""

    index: int
    id: str
    rgb: np.ndarray = field(repr=False, compare=False)
    stamp_ns: int = 0

    @property
    def sha256(self) -> str:
        """A hash of the pixels and shape: changed footage changes it."""
        from metavlm_ros.core.frames import frame_digest

        return frame_digest(self.rgb)


def load_images(frames: FrameSpec) -> list[CampaignImage]:
    """Read (or generate) every frame of a campaign, with unique file-safe ids.

    Raises:
        InputError: A source cannot be read, or no frame was selected.
        ParameterError: The selection is invalid.
    """
    from metavlm_ros.core.errors import InputError
    from metavlm_ros.core.frames import iter_frames, resize_longer_side, verify_sources

    items: list[tuple[str, np.ndarray, int]] = []
    if frames.generate is not None:
        for name, rgb in _generate_scenes(frames.generate):
            items.append((name, rgb, 0))
            if frames.max_frames is not None and len(items) >= frames.max_frames:
                break
    else:
        verify_sources(list(frames.sources))  # bags whole, against their checksums
        for frame in iter_frames(
            list(frames.sources),
            topic=frames.topic,
            every=frames.every,
            start=frames.start,
            end=frames.end,
            max_frames=frames.max_frames,
        ):
            items.append((frame.id, frame.rgb, frame.stamp_ns))
    if not items:
        raise InputError('frames: the selection holds no frames')
    images: list[CampaignImage] = []
    used: set[str] = set()
    for index, (name, rgb, stamp) in enumerate(items):
        safe = _safe_name(name)
        unique, n = safe, 2
        while unique in used:
            unique, n = f'{safe}-{n}', n + 1
        used.add(unique)
        rgb = resize_longer_side(rgb, frames.size) if frames.size else rgb
        images.append(CampaignImage(index=index, id=unique, rgb=np.ascontiguousarray(rgb), stamp_ns=stamp))
    return images


def _generate_scenes(spec: Mapping) -> Iterator[tuple[str, np.ndarray]]:
    """Synthetic scenes from core.scenes: scene i is the first frame of the scene seeded seed + i."""
    from metavlm_ros.core.scenes import SceneGenerator

    width, height = spec['size']
    for i in range(spec['count']):
        # One scene per image (not frames of one scene): campaigns want varied environments and objects.
        rgb, _ = SceneGenerator(width=width, height=height, seed=spec['seed'] + i).frame(0)
        yield f'scene-{spec["seed"] + i:03d}', np.ascontiguousarray(rgb)


def _safe_name(name: str) -> str:
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
    if expected != _sha256_text(
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
        if _sha256_file(path) != digest:
            return f'{name} does not match its checksum'
    return None


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, 'rb') as handle:
        for block in iter(lambda: handle.read(1 << 20), b''):
            digest.update(block)
    return digest.hexdigest()


def finished_cells(directory: str | Path) -> set[str]:
    """Ids of the committed cells under `directory` (a cell exists once its folder was renamed in)."""
    cells_dir = Path(directory) / CELLS_DIR
    if not cells_dir.is_dir():
        return set()
    return {p.name for p in cells_dir.iterdir() if p.is_dir() and not p.name.startswith('.')}


# ---------------------------------------------------------------------------------------------------
# Running one cell (on any worker)


@dataclass
class CellTask:
    """What a worker needs to run one cell; the frame travels separately (Dask scatters it once)."""

    cell: Cell
    model: ModelSpec
    search: Any  # SearchConfig
    threads: int | None = None
    stamp_ns: int = 0


@dataclass
class CellOutcome:
    """What a worker hands back: the cell's files (relative path -> bytes) and its timing."""

    cell: Cell
    files: dict[str, bytes]
    timing: dict


@functools.lru_cache(maxsize=4)
def _backend_for(key: str):
    """The backend of a model spec, built once per worker process (cells reuse it)."""
    from metavlm_ros.core.vlm import create_backend

    spec = ModelSpec(**json.loads(key))
    return create_backend(
        spec.backend,
        spec.model,
        classes=spec.classes,
        class_prompts=spec.class_prompts,
        prompts=spec.prompts,
        prompt=spec.prompt,
        device=spec.device,
        dtype=spec.dtype,
        confidence=spec.confidence,
        batch_size=spec.batch_size,
        vocabularies=spec.vocabularies,
    )


def run_cell(task: CellTask, frame: np.ndarray) -> CellOutcome:
    """Run one cell's search into a private scratch folder and return its files.

    Runs in whatever process the executor chose; nothing is written to the results directory here,
    so a worker on another machine needs no shared file system.
    """
    from metavlm_ros.core.results import ResultsStore
    from metavlm_ros.core.search import run_search

    started = time.time()
    torch_threads = None
    with contextlib.suppress(ImportError):
        import torch

        # The same pool size in every executor: torch's float sums depend on it, and the tables on them.
        if task.threads and torch.get_num_threads() != task.threads:
            torch.set_num_threads(task.threads)
        torch_threads = torch.get_num_threads()
    load_start = time.perf_counter()
    backend = _backend_for(task.model.key())
    load_seconds = time.perf_counter() - load_start
    cell = task.cell
    from metavlm_ros.core.scratch import scratch_path

    _remove_stale_scratch()
    scratch = scratch_path(Path(tempfile.gettempdir()) / _scratch_name())
    scratch.mkdir()
    try:
        with ResultsStore(scratch) as store:
            result = run_search(
                frame,
                backend,
                task.search,
                image_id=cell.image,
                store=store,
                extra_fields={
                    'model': task.model.model,
                    'backend': task.model.backend,
                    'stamp_ns': task.stamp_ns,
                    'run': cell.run,
                    'cell': cell.id,
                },
            )
        paths = sorted(p for p in scratch.rglob('*') if p.is_file())
        files = {str(p.relative_to(scratch)): p.read_bytes() for p in paths}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    timing = {
        'started': started,
        'finished': time.time(),
        'search_seconds': result.seconds,
        'backend_load_seconds': load_seconds,
        'evaluations': len(result.evaluations),
        'model_calls': result.model_calls,
        'hypervolume': result.hypervolume,
        'host': socket.gethostname(),
        'pid': os.getpid(),
        'torch_threads': torch_threads,
        'model_id': getattr(backend, 'model_id', task.model.model),
    }
    return CellOutcome(cell=cell, files=files, timing=timing)


def _scratch_name() -> str:
    # Named after this host too: a temporary directory shared by several machines holds the
    # scratch of processes that this one cannot see.
    return f'{SCRATCH_PREFIX}{_safe_name(socket.gethostname())}'


@functools.lru_cache(maxsize=1)
def _remove_stale_scratch() -> list[Path]:
    """Remove (once per process) the scratch folders that killed cells left in the temporary directory:
    only those this code names, made on this host by a process that no longer runs."""
    from metavlm_ros.core.scratch import remove_stale

    return remove_stale(tempfile.gettempdir(), _scratch_name())


def commit_cell(directory: str | Path, outcome: CellOutcome, fingerprint: str) -> Path | None:
    """Write a finished cell under cells/ atomically: files go to a scratch folder that is renamed in.

    The rename is the commit: a reader (or a resumed campaign) sees the whole cell or nothing.
    Returns the cell folder, or None when the cell was already committed.
    """
    cells_dir = Path(directory) / CELLS_DIR
    final = cells_dir / outcome.cell.id
    if final.exists():
        return None
    scratch = cells_dir / f'.tmp-{outcome.cell.id}-{os.getpid()}'
    if scratch.exists():
        shutil.rmtree(scratch)
    info = {**asdict(outcome.cell), 'fingerprint': fingerprint, **outcome.timing}
    # Checksums of every file and of the record itself: `verify_cell` and the report check them.
    info['files'] = {name: hashlib.sha256(data).hexdigest() for name, data in outcome.files.items()}
    info['checksum'] = _sha256_text(json.dumps(info, sort_keys=True))
    try:
        for name, data in outcome.files.items():
            target = scratch / name
            target.parent.mkdir(parents=True, exist_ok=True)
            _write_synced(target, data)
        _write_synced(scratch / CELL_FILE, (json.dumps(info, indent=1, sort_keys=True) + '\n').encode())
        os.rename(scratch, final)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)  # a full disk leaves no half-written cell behind
        raise
    _fsync_dir(cells_dir)
    return final


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, 'wb') as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# ---------------------------------------------------------------------------------------------------
# The campaign


@dataclass
class CampaignRun:
    """What one invocation of a campaign did."""

    directory: Path
    total: int
    skipped: int
    completed: int
    seconds: float

    @property
    def cells_per_minute(self) -> float:
        """Throughput of the cells this invocation ran."""
        return 60.0 * self.completed / self.seconds if self.seconds > 0 else float('nan')


def model_identity(spec: ModelSpec) -> dict:
    """The model's id, its directory on this machine and a hash of its safetensors weights."""
    from metavlm_ros.core.vlm import resolve_model, weights_hash

    directory = resolve_model(spec.backend, spec.model)
    return {
        'name': spec.name,
        'backend': spec.backend,
        'model': spec.model,
        'directory': directory,
        'weights_sha256': weights_hash(directory, length=64) or None,
    }


def _sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _campaign_record(
    config: CampaignConfig, images: Sequence[CampaignImage], identities: list[dict], cells: int
) -> dict:
    image_records = [
        {
            'index': im.index,
            'id': im.id,
            'width': int(im.rgb.shape[1]),
            'height': int(im.rgb.shape[0]),
            'stamp_ns': int(im.stamp_ns),
            'sha256': im.sha256,
        }
        for im in images
    ]
    identity = {
        'config': config.to_dict(),
        'models': [m['weights_sha256'] for m in identities],
        'images': [im['sha256'] for im in image_records],
    }
    return {
        'format': FORMAT,
        'package': 'metavlm_ros',
        'version': __version__,
        'fingerprint': _sha256_text(json.dumps(identity, sort_keys=True))[:16],
        'created': time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()),
        'config': config.to_dict(),
        'models': identities,
        'images': image_records,
        'cells': cells,
        'invocations': [],
    }


def _write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(f'.{path.name}.tmp')
    _write_synced(tmp, (json.dumps(data, indent=1, sort_keys=True) + '\n').encode())
    os.replace(tmp, path)


@contextlib.contextmanager
def _exclusive(directory: Path) -> Iterator[None]:
    """Hold the results directory for this process; a second campaign on it is refused."""
    handle = open(directory / LOCK_FILE, 'a+')  # noqa: SIM115
    try:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ParameterError(f'{directory}: another metavlm campaign is writing to it') from None
        yield
    finally:
        handle.close()  # closing releases the lock; a killed process releases it too


def run_campaign(
    config: CampaignConfig,
    out: str | Path,
    *,
    executor: str = 'local',
    workers: int = 1,
    scheduler: str | None = None,
    force: bool = False,
    threads: int | None = None,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
) -> CampaignRun:
    """Run every unfinished cell of a campaign and commit each one to `out` as it finishes.

    Args:
        config: The validated campaign.
        out: The results directory; created when missing, resumed when it holds this campaign.
        executor: 'local' (worker processes on this machine) or 'dask'.
        workers: Worker processes (local executor, or the local Dask cluster).
        scheduler: Address of a running Dask scheduler; None starts a loopback-only local cluster.
        force: Continue a results directory made with a different configuration.
        threads: Torch threads per cell, overriding the configuration's `threads` (default 1) for
            this invocation; every cell records the value it ran with. Floating-point sums depend on
            it, and NSGA-II follows them: the tables are the same on every executor only with the same
            value, which is why it does not follow the executor or the number of workers.
        progress: Show a progress bar with an ETA on stderr.
        log: Receives one-line status messages.

    Returns:
        Counts of planned, skipped and completed cells and the time taken.

    Raises:
        ParameterError: Bad executor options, or `out` holds a different campaign and not `force`.
        InputError: The frames cannot be read.
        ModelError: A model cannot be loaded (raised by the first cell that tries).
    """
    log = log or (lambda message: None)
    if executor not in EXECUTORS:
        raise ParameterError(f'unknown executor "{executor}" (choose from local, dask)')
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ParameterError(f'--workers must be an integer >= 1, got {workers!r}')
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ParameterError(f'--threads must be an integer >= 1, got {threads!r}')
    if scheduler is not None and executor != 'dask':
        raise ParameterError('--scheduler needs --executor dask')
    out = Path(out)
    check_output_dir(out)  # a file in the path, a read-only or full disk: before any frame or model
    _previous_record(out)  # a damaged campaign record, before anything is made there

    images = load_images(config.frames)
    cells = plan_cells(config, images)
    identities = [model_identity(spec) for spec in config.models]
    record = _campaign_record(config, images, identities, len(cells))
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise storage_error(out, exc) from None
    with _exclusive(out):
        try:
            record = _prepare_directory(out, record, images, force, log)
        except OSError as exc:
            raise storage_error(out, exc) from None
        fingerprint = record['fingerprint']
        done = _whole_cells(out, log)
        pending = [cell for cell in cells if cell.id not in done]
        skipped = len(cells) - len(pending)
        if skipped:
            log(f'resuming: {skipped} of {len(cells)} cells already finished')
        invocation = {
            'started': time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()),
            'executor': executor,
            'workers': workers,
            'scheduler': scheduler,
            'threads': threads,
            'host': socket.gethostname(),
            'pending': len(pending),
        }
        record['invocations'].append(invocation)
        _write_json_atomic(out / CAMPAIGN_FILE, record)

        frames = {im.index: im.rgb for im in images}
        if threads is None:
            threads = config.threads
        models = config.models
        stamps = {im.index: im.stamp_ns for im in images}
        tasks = [
            CellTask(c, models[c.model_index], _search_for(config, c), threads, stamps[c.image_index])
            for c in pending
        ]
        started = time.perf_counter()
        completed = 0
        bar = _progress_bar(len(cells), skipped, progress)
        try:
            if executor == 'dask':
                runner = _run_dask(tasks, frames, workers, scheduler, config, log)
            elif workers > 1:
                runner = _run_pool(tasks, frames, workers)
            else:
                runner = (run_cell(task, frames[task.cell.image_index]) for task in tasks)
            for outcome in runner:
                try:
                    commit_cell(out, outcome, fingerprint)
                except OSError as exc:
                    raise storage_error(out / CELLS_DIR / outcome.cell.id, exc) from None
                completed += 1
                bar.update(1)
        finally:
            bar.close()
        seconds = time.perf_counter() - started
        invocation.update(finished=time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()), completed=completed,
                          seconds=round(seconds, 3))  # fmt: skip
        try:
            _write_json_atomic(out / CAMPAIGN_FILE, record)
        except OSError as exc:
            raise storage_error(out / CAMPAIGN_FILE, exc) from None
    return CampaignRun(directory=out, total=len(cells), skipped=skipped, completed=completed, seconds=seconds)


def _whole_cells(out: Path, log) -> set[str]:
    """The committed cells that match their checksums; a damaged cell is set aside (never deleted)
    under cells/.damaged-<id>-<time> and runs again."""
    done = finished_cells(out)
    unverified = 0
    for cell_id in sorted(done):
        problem = verify_cell(out / CELLS_DIR / cell_id)
        if problem == UNVERIFIED:
            unverified += 1
        elif problem:
            aside = out / CELLS_DIR / f'.damaged-{cell_id}-{time.strftime("%Y%m%dT%H%M%S")}'
            try:
                os.rename(out / CELLS_DIR / cell_id, aside)
            except OSError as exc:
                raise storage_error(aside, exc) from None
            log(f'cell {cell_id} is damaged ({problem}): set aside as {aside.name}; it runs again')
            done.discard(cell_id)
    if unverified:
        log(f'{unverified} cell(s) carry no checksums (written before cells had them): not verified')
    return done


def _search_for(config: CampaignConfig, cell: Cell):
    return config.search_config(cell.algorithm, cell.seed)


def _previous_record(out: Path) -> dict | None:
    """The campaign record a results directory already holds (None: none yet).

    Raises:
        ParameterError: It is unreadable or not a mapping.
    """
    path = out / CAMPAIGN_FILE
    if not path.exists():
        return None
    try:
        previous = json.loads(path.read_text(encoding='utf-8'))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ParameterError(f'{path}: unreadable campaign record ({exc}); use another --out') from None
    if not isinstance(previous, dict):
        raise ParameterError(
            f'{path}: unreadable campaign record (a JSON {type(previous).__name__}, not a mapping); '
            'use another --out'
        )
    return previous


def _prepare_directory(out: Path, record: dict, images: Sequence[CampaignImage], force: bool, log) -> dict:
    """Start or resume a results directory; refuse one made by a different campaign unless forced."""
    previous = _previous_record(out)
    cells_dir = out / CELLS_DIR
    cells_dir.mkdir(exist_ok=True)
    # Leftovers of a killed run: cells that were being written and never committed.
    for stale in cells_dir.glob('.tmp-*'):
        shutil.rmtree(stale, ignore_errors=True)
    if previous is not None:
        if previous.get('fingerprint') != record['fingerprint']:
            if not force:
                raise ParameterError(
                    f'{out}: holds results of a different campaign config (fingerprint '
                    f'{previous.get("fingerprint")}, this config {record["fingerprint"]}); '
                    'use another --out, or --force to mix them'
                )
            log(f'--force: mixing with results of campaign {previous.get("fingerprint")}')
            record['previous'] = previous.get('previous', []) + [
                {k: previous.get(k) for k in ('fingerprint', 'created', 'config', 'models', 'images')}
            ]
            record['invocations'] = previous.get('invocations', [])
        else:
            if previous.get('version') != __version__:
                log(f'note: results started with metavlm_ros {previous.get("version")}, now {__version__}')
            record = {**record, 'created': previous.get('created', record['created']),
                      'invocations': previous.get('invocations', [])}  # fmt: skip
    elif finished_cells(out):
        if not force:
            raise ParameterError(f'{out}: holds cells but no {CAMPAIGN_FILE}; use another --out or --force')
    frames_dir = out / FRAMES_DIR
    frames_dir.mkdir(exist_ok=True)
    for image in images:
        target = frames_dir / f'{image.id}.png'
        if not target.exists():
            _save_png(target, image.rgb)
    return record


def _save_png(path: Path, rgb: np.ndarray) -> None:
    import cv2

    ok, data = cv2.imencode('.png', cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    if ok:
        tmp = path.with_name(f'.{path.name}.tmp')
        tmp.write_bytes(data.tobytes())
        os.replace(tmp, path)


def _progress_bar(total: int, initial: int, enabled: bool):
    from tqdm import tqdm

    # stderr: stdout stays for results and summaries.
    return tqdm(
        total=total, initial=initial, unit='cell', desc='campaign', disable=not enabled, file=sys.stderr
    )


def _run_pool(tasks: list[CellTask], frames: dict, workers: int) -> Iterator[CellOutcome]:
    """Cells on a pool of worker processes on this machine (spawned: no forked torch state)."""
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    if not tasks:
        return
    context = multiprocessing.get_context('spawn')
    pool = ProcessPoolExecutor(
        max_workers=workers, mp_context=context, initializer=_watch_parent, initargs=(os.getpid(),)
    )
    try:
        queue = iter(tasks)
        running = set()
        # Keep only a few cells queued per worker: a kill loses at most what is in flight.
        for task in queue:
            running.add(pool.submit(run_cell, task, frames[task.cell.image_index]))
            if len(running) >= 2 * workers:
                break
        while running:
            finished, running = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                yield future.result()
            for task in queue:
                running.add(pool.submit(run_cell, task, frames[task.cell.image_index]))
                if len(running) >= 2 * workers:
                    break
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _watch_parent(parent: int) -> None:
    """Pool worker start-up: exit when the campaign process is gone (a kill -9 would orphan workers)."""
    import threading

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name='metavlm-parent-watch', daemon=True).start()


def _run_dask(
    tasks: list[CellTask], frames: dict, workers: int, scheduler: str | None, config: CampaignConfig, log
) -> Iterator[CellOutcome]:
    """Cells as tasks on a Dask cluster: the given scheduler, or a loopback-only local cluster."""
    try:
        from distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise ParameterError(
            '--executor dask needs the optional Dask extra: pip install "metavlm_ros[dask]"'
        ) from None
    import logging

    if not tasks:
        return
    needs_gpu = any(task.model.needs_gpu for task in tasks)
    cluster = None
    if scheduler is None:
        # Advertise a GPU only where there is one; otherwise GPU cells run unconstrained and the
        # model's own device check reports the missing CUDA device instead of a task waiting forever.
        gpu_offered = needs_gpu and _cuda_available()
        resources = {'GPU': 1} if gpu_offered else None
        cluster = LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            host='127.0.0.1',  # loopback only: nothing of the cluster is reachable from the network
            dashboard_address=None,
            worker_dashboard_address=None,
            resources=resources,
            silence_logs=logging.ERROR,
        )
        client = Client(cluster)
        log(f'local Dask cluster with {workers} worker(s) at {cluster.scheduler_address}')
    else:
        try:
            client = Client(scheduler, timeout=30)
        except (OSError, TimeoutError, ValueError) as exc:
            raise ParameterError(f'cannot reach the Dask scheduler at {scheduler} ({exc})') from None
        log(f'Dask scheduler at {scheduler}')
        gpu_offered = needs_gpu
        if needs_gpu and not _offers_gpu(client.scheduler_info()):
            client.close()
            raise ParameterError(
                f'no worker of the Dask cluster at {scheduler} offers the GPU resource that cuda models need '
                '(start GPU workers with: dask worker ADDR --resources GPU=1)'
            )
    try:
        scattered = {index: client.scatter(rgb, broadcast=False) for index, rgb in frames.items()}
        futures = []
        for task in tasks:
            futures.append(
                client.submit(
                    run_cell,
                    task,
                    scattered[task.cell.image_index],
                    key=f'metavlm-cell-{task.cell.id}-{os.getpid()}-{time.time_ns()}',
                    pure=False,
                    resources=task_resources(task.model, gpu_offered),
                )
            )
        for future in as_completed(futures):
            yield future.result()
    finally:
        with contextlib.suppress(Exception):
            client.close()
        if cluster is not None:
            with contextlib.suppress(Exception):
                cluster.close()


def task_resources(spec: ModelSpec, gpu_offered: bool) -> dict | None:
    """The Dask worker resources a cell of this model asks for: one GPU for cuda models."""
    return {'GPU': 1} if spec.needs_gpu and gpu_offered else None


def _offers_gpu(info: Mapping) -> bool:
    """Whether any worker in a Dask scheduler_info() offers at least one GPU resource."""
    return any(w.get('resources', {}).get('GPU', 0) >= 1 for w in info.get('workers', {}).values())


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def read_campaign(directory: str | Path) -> dict:
    """The campaign record (campaign.json) of a results directory.

    Raises:
        InputError: The directory is not a campaign results directory.
    """
    from metavlm_ros.core.errors import InputError

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
