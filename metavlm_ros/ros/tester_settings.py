"""The tester's parameter table and their conversion into validated settings (TesterSettings)."""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from metavlm_ros.assurance.criteria import Criteria, load_criteria
from metavlm_ros.common.errors import ParameterError
from metavlm_ros.explain.tracker import DEFAULT_SAMPLE
from metavlm_ros.method import defaults
from metavlm_ros.method.boxes import DEFAULT_IOU_THRESHOLD
from metavlm_ros.method.encoding import SearchSpace
from metavlm_ros.method.extra import Extra
from metavlm_ros.method.metrics import DEFAULT_THRESHOLDS
from metavlm_ros.method.relations import DEFAULT_RELATIONS, RELATIONS
from metavlm_ros.method.search import (
    ALGORITHMS,
    SearchConfig,
)
from metavlm_ros.models.registry import backend_class, resolve_options
from metavlm_ros.ros.parameters import MODEL_PARAMETERS, ParameterSpec, model_options
from metavlm_ros.viewer import DEFAULT_HOST

__all__ = [
    'ENDPOINTS',
    'MODES_PERIOD_S',
    'NODE_NAME',
    'PARAMETERS',
    'PARAMETER_DEFAULTS',
    'RESULTS_MAX_MB',
    'TRANSPORTS',
    'TesterSettings',
    'coerce_parameters',
    'settings_from_parameters',
]

NODE_NAME = 'metavlm_tester'


ENDPOINTS = ('ros', 'inprocess')


TRANSPORTS = ('raw', 'compressed')


#: Least seconds between two catalogues of the failure modes on /diagnostics. At the default sample
#: (50,000 evaluations) one takes 1 to 2 s on 2 shared cores (bench/modes.py): 2 to 3 % of a core,
#: off the search's thread.
MODES_PERIOD_S = 60.0


#: The tester's results budget (MiB): 56 hours at the 190 MB an hour its defaults write (20 at the
#: 500 MB an hour of issue 30; docs/results.md, "Disk budget"); past it no more PNGs, records go on.
RESULTS_MAX_MB = 10240


@dataclass(frozen=True)
class TesterSettings:
    """The tester's validated parameters; a new value replaces them all at once, for the next search."""

    search: SearchConfig
    endpoint: str = 'ros'
    transport_size: int = 384
    probe_timeout_s: float = 5.0
    frame_period_s: float = 5.0
    results_dir: str = 'results/ros'
    min_free_disk_mb: int = 1024
    results_max_mb: int = RESULTS_MAX_MB
    violation_pngs_per_search: int = defaults.TESTER_VIOLATION_PNGS
    image_transport: str = 'raw'
    report_threshold: float = 0.05
    publish_violation_images: bool = True
    violation_image_height: int = 360
    foxglove_port: int = 0
    foxglove_host: str = DEFAULT_HOST
    model: dict = field(default_factory=dict)
    #: The acceptance criteria whose status /diagnostics keeps (criteria_file; None: none).
    criteria: Criteria | None = None
    #: The failure modes on /diagnostics: learnt again at most this often (s; 0: off), from at most
    #: `modes_sample` evaluations (a uniform sample of all of them).
    modes_period_s: float = MODES_PERIOD_S
    modes_sample: int = DEFAULT_SAMPLE


def _range_parameter(relation_id: str) -> str:
    return f'ranges.{relation_id}'


# Every range the tester takes, (id, what, low, high, default): each relation's parameter, then its
# extras' (`ranges.motion_blur_angle`), which SearchSpace.from_options narrows alike; an extra's default
# is the span a search gives it (a prior's nominal value: MR12's lamps and range prior).
_RANGES: tuple[tuple[str, str, float, float, tuple[float, float]], ...] = tuple(
    entry
    for r in RELATIONS
    for entry in (
        (r.id, f'MR{r.number} {r.parameter}', r.low, r.high, (r.low, r.high)),
        *(
            (extra_id, f'MR{r.number} {e.name} ({e.unit})', e.low, e.high, e.span)
            for extra_id, e in zip(r.extra_ids, r.extras, strict=True)
        ),
    )
)


# The extras that name their values (MR12's Jerlov water types, MR13's pasted classes): their ranges
# take names or numbers, each end read by the extra itself (`Extra.read`), as `--range` and criteria
# files read them.
_NAMED_EXTRAS: dict[str, Extra] = {
    extra_id: extra
    for r in RELATIONS
    for extra_id, extra in zip(r.extra_ids, r.extras, strict=True)
    if extra.parse is not None
}


def _range_spec(rid: str, what: str, low: float, high: float, default: tuple[float, float]) -> ParameterSpec:
    name, start = _range_parameter(rid), [float(default[0]), float(default[1])]
    description = f'[low, high] of {what}, inside [{low:g}, {high:g}]'
    extra = _NAMED_EXTRAS.get(rid)
    if extra is None:
        return ParameterSpec(name, start, description, low=low, high=high)
    # A string array or a number array: typed when set, read in settings_from_parameters.
    example = f'[{extra.text(low)}, {extra.text(high)}]'
    return ParameterSpec(name, start, f'{description}; or by name, e.g. {example}', dynamic_typing=True)


_UNIT = 0.999999


PARAMETERS: tuple[ParameterSpec, ...] = (
    ParameterSpec('algorithm', defaults.ALGORITHM, 'search algorithm', choices=ALGORITHMS),
    ParameterSpec('population', defaults.POPULATION, 'individuals per generation', low=2, high=100_000),
    ParameterSpec(
        'evaluations', defaults.EVALUATIONS, 'evaluations per searched frame', low=1, high=10_000_000
    ),
    ParameterSpec(
        'generations', 0, 'generations per frame; when > 0 it sets evaluations', low=0, high=1_000_000
    ),
    ParameterSpec(
        'seed', defaults.SEED, 'seed of every search (same seed, same genotypes)', low=0, high=2**31 - 1
    ),
    ParameterSpec(
        'relations',
        list(DEFAULT_RELATIONS),
        'relations the search may activate: ids or the groups paper, underwater, all (docs/method.md §12)',
    ),
    *(_range_spec(rid, what, low, high, default) for rid, what, low, high, default in _RANGES),
    ParameterSpec(
        'thresholds', list(DEFAULT_THRESHOLDS), 'confidence change thresholds (Eq. 5)', low=1e-9, high=_UNIT
    ),
    ParameterSpec(
        'report_threshold', 0.05, 'the threshold whose violations are published', low=1e-9, high=_UNIT
    ),
    ParameterSpec(
        'iou_threshold',
        DEFAULT_IOU_THRESHOLD,
        'detections: a matched box below this IoU is displaced (docs/method.md §13)',
        low=1e-9,
        high=_UNIT,
    ),
    ParameterSpec(
        'find_inserted',
        False,
        'object insertion (MR13): the pasted object must be found, not only the others kept',
    ),
    ParameterSpec(
        'working_size',
        -1,
        'longer side the relations work at (-1: auto, 2x transport_size or the model input; 0: frame size)',
        low=-1,
        high=16384,
    ),
    ParameterSpec(
        'transport_size', 384, 'longer side of frames sent to the model (0: as is)', low=0, high=16384
    ),
    ParameterSpec(
        'vlm_endpoint', 'ros', 'ros: the perception node; inprocess: a model here', True, choices=ENDPOINTS
    ),
    ParameterSpec(
        'probe_timeout_s', 5.0, 'seconds to wait for a probe answer (retried once)', low=0.01, high=3600.0
    ),
    ParameterSpec(
        'frame_period_s', 5.0, 'least seconds between the starts of two searches', low=0.0, high=86400.0
    ),
    ParameterSpec('results_dir', 'results/ros', 'directory of the JSON Lines records and follow-up PNGs'),
    ParameterSpec(
        'criteria_file',
        '',
        "acceptance criteria (YAML, docs/assurance.md): each one's status on /diagnostics, judged on "
        'results_dir as searches end; empty: none',
    ),
    ParameterSpec(
        'modes_period_s',
        MODES_PERIOD_S,
        'least seconds between two catalogues of the failure modes on /diagnostics, learnt once new '
        'violations arrived, in a thread of their own (docs/explain.md); 0: off',
        low=0.0,
        high=86400.0,
    ),
    ParameterSpec(
        'modes_sample',
        DEFAULT_SAMPLE,
        'most evaluations the failure modes are learnt from: a uniform sample of all the tester judged '
        '(memory and time a catalogue takes stay bounded)',
        low=100,
        high=10_000_000,
    ),
    ParameterSpec(
        'min_free_disk_mb',
        1024,
        'free space (MiB) kept on the results disk: below it searches pause and PNGs are not written; 0: off',
        low=0,
        high=1_000_000_000,
    ),
    ParameterSpec(
        'results_max_mb',
        RESULTS_MAX_MB,
        'disk budget (MiB) of results_dir: past it no PNGs are written, records go on, none deleted; 0: off',
        low=0,
        high=1_000_000_000,
    ),
    ParameterSpec(
        'pareto_pngs',
        defaults.TESTER_PARETO_PNGS,
        'follow-up PNGs per search for its Pareto set: the smallest-f_trans violation, the largest f_pred, '
        'then spread along the front (-1: every member; 0: none); any other: metavlm render',
        low=-1,
        high=1_000_000,
    ),
    ParameterSpec(
        'violation_pngs_per_search',
        defaults.TESTER_VIOLATION_PNGS,
        'follow-up PNGs written per search for its first published violations (the Pareto set: '
        'pareto_pngs); any other: metavlm render',
        low=0,
        high=1_000_000,
    ),
    ParameterSpec('image_transport', 'raw', 'camera transport', True, choices=TRANSPORTS),
    ParameterSpec('publish_violation_images', True, 'publish violation_image and violation_followup'),
    ParameterSpec(
        'violation_image_height',
        360,
        'panel height of violation_image and violation_followup',
        low=32,
        high=4096,
    ),
    # Taken at configure (a port that cannot be bound refuses it); a change applies at the next one.
    ParameterSpec(
        'foxglove_port',
        0,
        "serve Foxglove's WebSocket protocol on this port from configure to cleanup (0: off)",
        low=0,
        high=65535,
    ),
    ParameterSpec(
        'foxglove_host', DEFAULT_HOST, 'address the Foxglove server binds (127.0.0.1: this machine only)'
    ),
    # The inprocess endpoint's model: the perception node's model parameters, read-only here.
    *(
        replace(spec, description=f'{spec.description} (inprocess endpoint)', read_only=True)
        for spec in MODEL_PARAMETERS
    ),
)
PARAMETER_DEFAULTS: dict[str, Any] = {spec.name: spec.default for spec in PARAMETERS}


def coerce_parameters(values: Mapping[str, Any]) -> dict[str, Any]:
    """Turn integers given for floating-point tester parameters into floats (ROS refuses them otherwise).

    Args:
        values: tester parameter name -> value, e.g. from a YAML file (names unknown here pass through).

    Returns:
        A copy with `5` turned into `5.0` and `[0.8, 1]` into `[0.8, 1.0]` where the parameter is a double.
    """
    out = dict(values)
    for name, value in values.items():
        default = PARAMETER_DEFAULTS.get(name)
        if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            out[name] = float(value)
        elif (
            isinstance(default, list)
            and default
            and isinstance(default[0], float)
            and isinstance(value, list)
        ):
            out[name] = [float(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in value]
    return out


def settings_from_parameters(values: Mapping[str, Any]) -> TesterSettings:
    """Validate the tester's parameters together and build its settings.

    Args:
        values: parameter name -> value, as declared by TesterNode (see config/metavlm.yaml).

    Returns:
        The settings.

    Raises:
        ParameterError: the first invalid value, with the reason.
    """
    values = {**PARAMETER_DEFAULTS, **values}  # the table's defaults, the one place they are written
    ranges = {}
    for rid, *_ in _RANGES:
        name = _range_parameter(rid)
        bounds = _range_value(name, values[name], _NAMED_EXTRAS.get(rid))
        try:
            SearchSpace.from_options(None, {rid: bounds})
        except ParameterError as exc:
            raise ParameterError(f'{name}: {exc}') from None
        ranges[rid] = (float(bounds[0]), float(bounds[1]))
    relations = list(values['relations'])
    try:
        space = SearchSpace.from_options(relations, ranges)
    except ParameterError as exc:
        raise ParameterError(f'relations: {exc}') from None
    population = int(values['population'])
    generations = int(values['generations'])
    evaluations = generations * population if generations > 0 else int(values['evaluations'])
    thresholds = tuple(float(t) for t in values['thresholds'])
    working_size = int(values['working_size'])
    config = SearchConfig(
        algorithm=str(values['algorithm']),
        population=population,
        evaluations=evaluations,
        seed=int(values['seed']),
        space=space,
        thresholds=thresholds,
        working_size='auto' if working_size == -1 else working_size or None,
        pareto_pngs=int(values['pareto_pngs']),
        iou_threshold=float(values['iou_threshold']),
        find_inserted=bool(values['find_inserted']),
    ).validate()
    report_threshold = float(values['report_threshold'])
    if not any(math.isclose(report_threshold, t) for t in thresholds):
        raise ParameterError(
            f'report_threshold {report_threshold:g} must be one of the thresholds '
            f'{", ".join(f"{t:g}" for t in thresholds)}'
        )
    endpoint = str(values['vlm_endpoint'])
    if endpoint not in ENDPOINTS:
        raise ParameterError(f'vlm_endpoint must be one of {", ".join(ENDPOINTS)}, got {endpoint!r}')
    transport = str(values['image_transport'])
    if transport not in TRANSPORTS:
        raise ParameterError(f'image_transport must be one of {", ".join(TRANSPORTS)}, got {transport!r}')
    probe_timeout_s = float(values['probe_timeout_s'])
    if not probe_timeout_s > 0:
        raise ParameterError(f'probe_timeout_s must be positive, got {probe_timeout_s:g}')
    frame_period_s = float(values['frame_period_s'])
    if not frame_period_s >= 0:
        raise ParameterError(f'frame_period_s must be 0 or more, got {frame_period_s:g}')
    transport_size = int(values['transport_size'])
    if transport_size < 0:
        raise ParameterError(f'transport_size must be 0 (off) or positive, got {transport_size}')
    results_dir = str(values['results_dir'])
    if not results_dir.strip():
        raise ParameterError('results_dir must not be empty')
    foxglove_host = _bind_address(str(values['foxglove_host']))
    backend, model_name, options = model_options(values)
    criteria = _criteria(str(values['criteria_file']), thresholds, backend)
    resolved = resolve_options(backend, options)
    # The model's options, resolved; `options` holds what the parameters gave (create_backend's input).
    model = {'backend': backend, 'model': model_name, 'options': options, 'resolved': resolved}
    return TesterSettings(
        search=config,
        endpoint=endpoint,
        transport_size=transport_size,
        probe_timeout_s=probe_timeout_s,
        frame_period_s=frame_period_s,
        results_dir=results_dir,
        min_free_disk_mb=int(values['min_free_disk_mb']),
        results_max_mb=int(values['results_max_mb']),
        violation_pngs_per_search=int(values['violation_pngs_per_search']),
        image_transport=transport,
        report_threshold=report_threshold,
        publish_violation_images=bool(values['publish_violation_images']),
        violation_image_height=int(values['violation_image_height']),
        foxglove_port=int(values['foxglove_port']),
        foxglove_host=foxglove_host,
        model=model,
        criteria=criteria,
        modes_period_s=float(values['modes_period_s']),
        modes_sample=int(values['modes_sample']),
    )


def _range_value(name: str, value: Any, extra: Extra | None) -> list:
    """A range parameter's [low, high]; where the extra names its values, each end read as a name ('II')
    or a number, into the number the search and its records use."""
    bounds = list(value) if isinstance(value, Iterable) and not isinstance(value, str) else None
    if bounds is None or len(bounds) != 2:
        raise ParameterError(f'{name} must be [low, high], got {value if bounds is None else bounds!r}')
    if extra is None:
        return bounds
    try:
        return [extra.read(v) for v in bounds]
    except ParameterError as exc:
        raise ParameterError(f'{name}: {exc}') from None


def _criteria(path: str, thresholds: tuple[float, ...], backend: str) -> Criteria | None:
    """The criteria file's criteria, checked against the searches' thresholds (None: no file)."""
    if not path.strip():
        return None
    try:
        criteria = load_criteria(path)
    except ParameterError as exc:
        raise ParameterError(f'criteria_file: {exc}') from None
    if 'confidence' in backend_class(backend).kinds and not any(
        math.isclose(criteria.threshold, t) for t in thresholds
    ):
        raise ParameterError(
            f'criteria_file: {path} judges at threshold {criteria.threshold:g}, not one of the thresholds '
            f'{", ".join(f"{t:g}" for t in thresholds)}'
        )
    return criteria


_HOSTNAME = re.compile(
    r'(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*'
)


def _bind_address(host: str) -> str:
    """foxglove_host as an address to bind: an IP address or a host name, without a port."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    if not _HOSTNAME.fullmatch(host):
        raise ParameterError(
            f'foxglove_host must be an IP address or host name to bind, e.g. {DEFAULT_HOST} '
            f'(the port is foxglove_port), got {host!r}'
        )
    return host
