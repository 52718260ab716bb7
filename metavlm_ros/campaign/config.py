"""Campaign configuration: the JSON/YAML schema, its parsing and one message per mistake."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from metavlm_ros.campaign.spec import (
    EXECUTORS,
    FRAME_KEYS,
    GENERATE_KEYS,
    MODEL_KEYS,
    PAPER_ALGORITHMS,
    RELATION_KEYS,
    TOP_KEYS,
    CampaignConfig,
    FrameSpec,
    ModelSpec,
    search_space,
    sha256_text,
)
from metavlm_ros.common.errors import MetaVLMError, ParameterError
from metavlm_ros.method import defaults
from metavlm_ros.method.boxes import DEFAULT_IOU_THRESHOLD
from metavlm_ros.method.metrics import DEFAULT_THRESHOLDS

# The configuration's types live in campaign/spec.py; `metavlm_ros.campaign.config` stays their one
# import for callers (cells, executors, runner, commands, the tests).
__all__ = [
    'CampaignConfig',
    'EXECUTORS',
    'FrameSpec',
    'ModelSpec',
    'PAPER_ALGORITHMS',
    'load_config',
    'parse_config',
    'sha256_text',
]


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
    problems.unknown_keys('', data, TOP_KEYS)

    frames = _parse_frames(data.get('frames'), base_dir, problems)
    models = _parse_models(data.get('models'), base_dir, problems)

    algorithms: tuple[str, ...] = PAPER_ALGORITHMS
    raw_algorithms = data.get('algorithms')
    if raw_algorithms is not None:
        if isinstance(raw_algorithms, str):
            raw_algorithms = [raw_algorithms]
        if not isinstance(raw_algorithms, list) or not raw_algorithms:
            problems.add('algorithms', f'must be a non-empty list, got {raw_algorithms!r}')
        else:
            from metavlm_ros.method.search import ALGORITHMS  # the optimiser registry; pymoo loads slowly

            for i, name in enumerate(raw_algorithms):
                if name not in ALGORITHMS:
                    choices = ', '.join(ALGORITHMS)
                    problems.add(f'algorithms[{i}]', f'unknown algorithm "{name}" (choose from {choices})')
            if len(set(map(str, raw_algorithms))) != len(raw_algorithms):
                problems.add('algorithms', 'lists an algorithm twice')
            algorithms = tuple(str(a) for a in raw_algorithms)

    baseline = data.get('baseline')
    if baseline is not None and baseline != 'all' and baseline not in algorithms:
        problems.add(
            'baseline', f'must be one of the algorithms ({", ".join(algorithms)}) or all, got {baseline!r}'
        )
        baseline = None

    runs = problems.integer('runs', data.get('runs'), 1, 10)
    population = problems.integer('population', data.get('population'), 2, defaults.POPULATION)
    evaluations = problems.integer('evaluations', data.get('evaluations'), 1, defaults.EVALUATIONS)
    seed = problems.integer('seed', data.get('seed'), 0, defaults.SEED)
    working_size = problems.integer('working_size', data.get('working_size'), 8, None)
    threads = problems.integer('threads', data.get('threads'), 1, 1)
    from metavlm_ros.method.relations import WARPS

    warp = data.get('warp', 'sequential')
    if warp not in WARPS:
        problems.add('warp', f'must be one of {", ".join(WARPS)}, got {warp!r}')
    from metavlm_ros.method.search import parse_pareto_pngs

    pareto_pngs = data.get('pareto_pngs', defaults.PARETO_PNGS)
    try:
        pareto_pngs = parse_pareto_pngs(pareto_pngs)
    except ParameterError as exc:
        problems.add('pareto_pngs', str(exc))

    thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS
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

    iou_threshold = problems.number('iou_threshold', data.get('iou_threshold', DEFAULT_IOU_THRESHOLD))
    if iou_threshold is not None and not 0 < iou_threshold <= 1:
        problems.add('iou_threshold', f'must lie in (0, 1], got {iou_threshold}')
    find_inserted = data.get('find_inserted', False)
    if not isinstance(find_inserted, bool):
        problems.add('find_inserted', f'must be true or false, got {find_inserted!r}')

    relations = data.get('relations')
    if relations is not None:
        if not isinstance(relations, Mapping):
            problems.add('relations', f'must be a mapping with enabled and ranges, got {relations!r}')
            relations = None
        else:
            problems.unknown_keys('relations', relations, RELATION_KEYS)
            relations = {k: relations[k] for k in sorted(RELATION_KEYS) if relations.get(k) is not None}
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
                search_space(relations)
            except MetaVLMError as exc:
                problems.add('relations', str(exc))
            except (TypeError, ValueError, AttributeError) as exc:
                problems.add('relations', f'invalid ({exc})')
    water_ranges = _parse_water_ranges(data.get('water_ranges', 'prior'), relations, problems)

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
        iou_threshold=float(iou_threshold),
        find_inserted=bool(find_inserted),
        water_ranges=water_ranges,
        working_size=working_size,
        relations=relations or None,
        warp=str(warp),
        pareto_pngs=pareto_pngs,
        threads=threads,
        baseline=None if baseline is None else str(baseline),
    )


def _parse_water_ranges(raw: Any, relations: Mapping | None, problems: _Problems) -> str:
    """`water_ranges`: MR12's priors, or each frame's range map ('truth'), which only a campaign that
    searches the relation water has a use for."""
    from metavlm_ros.method.water_ranges import WATER_RANGES

    if not isinstance(raw, str) or raw not in WATER_RANGES:
        problems.add('water_ranges', f'must be one of {", ".join(WATER_RANGES)}, got {raw!r}')
        return 'prior'
    if raw == 'truth':
        try:
            enabled = search_space(relations).enabled_ids
        except (MetaVLMError, TypeError, ValueError, AttributeError):
            return raw  # the relations' own problem is reported
        if 'water' not in enabled:
            problems.add(
                'water_ranges', "'truth' is for MR12 water, which the campaign's relations leave out"
            )
    return raw


def _parse_frames(raw: Any, base_dir: Path, problems: _Problems) -> FrameSpec:
    if raw is None:
        problems.add('frames', 'is required (a list of images, folders, videos or bags, or {generate: ...})')
        return FrameSpec()
    if isinstance(raw, (str, list)):
        raw = {'sources': raw}
    if not isinstance(raw, Mapping):
        problems.add('frames', f'must be a list of paths or a mapping, got {raw!r}')
        return FrameSpec()
    problems.unknown_keys('frames', raw, FRAME_KEYS)
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
        problems.add('frames', 'needs sources (images, folders, videos or bags) or generate')
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
    problems.unknown_keys('frames.generate', raw, GENERATE_KEYS)
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
    from metavlm_ros.models.registry import BACKENDS, all_options, given_options, resolve_options

    models: list[ModelSpec] = []
    names: set[str] = set()
    for i, item in enumerate(raw):
        where = f'models[{i}]'
        if not isinstance(item, Mapping):
            problems.add(where, f'must be a mapping with backend and model, got {item!r}')
            continue
        backend = problems.string(f'{where}.backend', item.get('backend'), required=True)
        options: dict[str, Any] = {}
        if backend not in BACKENDS:
            if backend is not None:
                choices = ', '.join(BACKENDS)
                problems.add(f'{where}.backend', f'unknown backend "{backend}" (choose from {choices})')
            problems.unknown_keys(where, item, MODEL_KEYS | set(all_options()))
        else:
            declared = {option.name for option in BACKENDS[backend].all_options()}
            problems.unknown_keys(where, item, MODEL_KEYS | declared)
            given = {key: value for key, value in item.items() if key in declared}
            try:
                options = resolve_options(backend, given_options(backend, given))
            except ParameterError as exc:
                problems.add(where, str(exc))
        model = problems.string(f'{where}.model', item.get('model'), required=True)
        if model is not None:
            model = _resolve_model(model, backend, base_dir, f'{where}.model', problems)
        name = problems.string(f'{where}.name', item.get('name'))
        if name is None:
            name = f'{backend}:{Path(model or "model").name}'
        if name in names:
            if item.get('name') is not None:
                problems.add(f'{where}.name', f'"{name}" is used by another model')
            name = f'{name}#{i}'
        names.add(name)
        models.append(ModelSpec(name=name, backend=backend or '', model=model or '', options=options))
    return models


def _resolve_model(model: str, backend: str | None, base_dir: Path, where: str, problems: _Problems) -> str:
    """A model is a directory (relative to the config file), a cached Hugging Face id, or 'demo'."""
    from metavlm_ros.common.errors import ModelError
    from metavlm_ros.models.vlm import BACKENDS, resolve_model

    path = Path(model).expanduser()
    candidate = path if path.is_absolute() else base_dir / path
    if candidate.exists():
        model = str(candidate.resolve())
    elif path.is_absolute() or model.startswith(('.', '~')):
        problems.add(where, f'no such model directory: {candidate}')
        return model
    if backend in BACKENDS and BACKENDS[backend].local_model:
        try:
            resolve_model(backend, model)
        except ModelError as exc:
            problems.add(where, str(exc))
    return model
