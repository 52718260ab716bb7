"""A results directory as one MCAP that Foxglove and Lichtblick open, optionally merged with its bag."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import foxglove
from foxglove.mcap import MCAPWriteOptions

from metavlm_ros.campaign.cells import CELL_FILE, UNVERIFIED, verify_cell
from metavlm_ros.common.errors import InputError, ParameterError, ResultsError
from metavlm_ros.common.images import encode_png
from metavlm_ros.common.range_maps import read_source_ranges
from metavlm_ros.common.results import (
    EVALUATIONS,
    IDENTITY,
    PARETO,
    SUMMARY,
    VIOLATIONS,
    iter_jsonl,
    read_identity,
    read_source_frame,
    record_key,
    records_file,
    search_key,
)

# The PNG check load_image runs before decoding; decoding every follow-up would be 80% of an export.
from metavlm_ros.footage.frames import check_png, is_video_path
from metavlm_ros.method.render import render_followup
from metavlm_ros.viewer.channels import ViolationChannels, image_size

__all__ = ['ExportResult', 'export_mcap', 'find_results', 'is_violation', 'time_of']

#: Files of a demo or campaign directory attached as they are (reports a reviewer reads beside the data).
REPORTS = ('report.md', 'report.json', 'campaign.json')
# Records of image files carry no camera time: their searches are laid one second apart.
SEARCH_SPACING_NS = 1_000_000_000


@dataclass
class ExportResult:
    """What an export wrote."""

    path: Path
    directories: list[str] = field(default_factory=list)
    violations: int = 0
    followups: int = 0
    rendered: int = 0  # follow-ups made again from the stored source frame (no PNG was kept)
    unrendered: int = 0  # violations of searches without a stored source frame: record only
    sources: int = 0
    summaries: int = 0
    bag_messages: int = 0
    bytes: int = 0


@dataclass
class _Results:
    """One results directory, read and verified."""

    path: Path
    prefix: str
    identity: dict | None
    violations: list[dict]
    summaries: list[dict]
    frames: dict[tuple, str]  # record key -> follow-up PNG (relative to the directory)
    searches: list[tuple]  # search keys in the order their first record was written
    finished: dict[tuple, dict] = field(default_factory=dict)  # search key -> its summary (if written)

    def summary_of(self, record: dict) -> dict | None:
        """The summary of the search a record belongs to (None: the search wrote none, it was cut short)."""
        key = search_key(record)
        # A summary names its model even where the records do not (as method/render.py matches).
        return self.finished.get(key) or self.finished.get((*key[:3], None, key[4]))


def find_results(root: str | Path) -> list[tuple[Path, str]]:
    """The results directories of `root` and the topic prefix of each.

    `root` itself when it holds records (search, tester node, `metavlm run`, a campaign cell);
    else its subfolders that do, one level or two down (a demo's `clip/`, `blip/`, ...; a
    campaign's `cells/<id>/`), each under `/metavlm/<subfolder>`. Hidden folders (scratch, cells
    set aside as damaged) are skipped.

    Raises:
        InputError: `root` is missing, not a directory, or holds no results.
    """
    root = Path(root)
    if not root.is_dir():
        raise InputError(f'{root}: not a results directory (no such directory)')
    if _has_records(root):
        return [(root, '/metavlm')]
    found = []
    for candidate in sorted(root.glob('*')) + sorted(root.glob('*/*')):
        parts = candidate.relative_to(root).parts
        if candidate.is_dir() and not any(p.startswith('.') for p in parts) and _has_records(candidate):
            found.append((candidate, '/metavlm/' + '/'.join(parts)))
    if not found:
        raise InputError(
            f'{root}: not a results directory (no {EVALUATIONS}, {SUMMARY} or {VIOLATIONS} '
            'in it or its subfolders)'
        )
    return found


def _has_records(directory: Path) -> bool:
    return any(records_file(directory / name).is_file() for name in (EVALUATIONS, SUMMARY, VIOLATIONS))


def _records(path: Path) -> list[dict]:
    """Every record of a results file, verified: a damaged line that records follow is refused.

    The one place records are read, so that a change of the on-disk format is adapted here.
    """
    return list(iter_jsonl(path, strict=True))


def is_violation(record: dict) -> bool:
    """Whether an evaluation record is a violation by any of its criteria (Eq. 4 or 5)."""
    return (
        not record.get('failed')
        and int(record.get('order') or 0) > 0
        and any(bool(v) for v in (record.get('violation') or {}).values())
    )


def time_of(record: dict, searches: list[tuple]) -> int:
    """A record's time on the timeline: its source frame's camera stamp (ns).

    The tester's `source_stamp`, else the bag stamp or video position `stamp_ns` (a video's first
    frame is at 0); records of image files (no stamp) get one second per search, in the order the
    searches were written.
    """
    for name in ('source_stamp', 'stamp_ns'):
        value = record.get(name)
        if value or (value == 0 and name == 'stamp_ns' and is_video_path(record.get('frame_file') or '')):
            return int(value)
    key = record_key(record)[:-1]
    position = searches.index(key) if key in searches else len(searches)
    return (position + 1) * SEARCH_SPACING_NS


def _read_results(directory: Path, prefix: str) -> _Results:
    """Read and verify one results directory (docs/results.md: strict records, identity, cell checksums)."""
    cell = directory / CELL_FILE
    if cell.is_file():
        problem = verify_cell(directory)
        if problem and problem != UNVERIFIED:
            raise ResultsError(f'{directory}: damaged campaign cell ({problem})')
    identity = read_identity(directory)
    evaluations = _records(directory / EVALUATIONS)
    published = directory / VIOLATIONS
    if records_file(published).is_file():
        # The tester node's own choice (its report threshold) of what was a violation.
        violations = _records(published)
    else:
        violations = [r for r in evaluations if is_violation(r)]
    frames: dict[tuple, str] = {}
    for record in [*_records(directory / PARETO), *violations]:
        if record.get('frame'):
            frames.setdefault(record_key(record), record['frame'])
    searches: list[tuple] = []
    for record in [*evaluations, *violations]:
        key = record_key(record)[:-1]
        if key not in searches:
            searches.append(key)
    summaries = _records(directory / SUMMARY)
    finished: dict[tuple, dict] = {}
    for summary in summaries:
        # A stopped search's summary names its stored source too: its records render all the same.
        finished[search_key(summary)] = summary
        finished.setdefault((*search_key(summary)[:3], None, summary.get('run')), summary)
    return _Results(directory, prefix, identity, violations, summaries, frames, searches, finished)


def _source_png(results: _Results, summary: dict, *, pixels: bool = True) -> bytes | None:
    """A search's stored source frame (PNG bytes), checked whole and (`pixels`) against its `source_sha256`.

    None: the search stored none (written before source frames were, or the disk budget refused it).
    """
    relative = summary.get('source_frame')
    if not relative or not summary.get('source_sha256'):
        return None
    path = results.path / relative
    if not path.is_file():
        raise ResultsError(
            f'{path}: the source frame of {summary.get("image")} is named by its summary but missing'
        )
    data = path.read_bytes()
    # The chunk CRCs first: libpng would print its own lines for a damaged file before failing.
    problem = check_png(data) if data.startswith(b'\x89PNG\r\n\x1a\n') else 'not a PNG'
    if problem:
        raise ResultsError(f'{path}: damaged source frame ({problem})')
    if pixels:
        read_source_frame(results.path, summary)  # the pixels against source_sha256
    return data


class _Renderer:
    """Follow-ups made again from stored source frames, one decoded source held at a time."""

    def __init__(self, results: _Results) -> None:
        self.results = results
        self._digest: str | None = None
        self._source = None
        self._ranges = None

    def followup(self, record: dict) -> bytes | None:
        """The follow-up PNG of a violation whose PNG was not kept (None: no stored source frame)."""
        summary = self.results.summary_of(record)
        if summary is None or not summary.get('source_frame') or not summary.get('source_sha256'):
            return None
        if summary['source_sha256'] != self._digest:
            # Records come search by search: one source in memory, not a whole run's worth.
            self._source = read_source_frame(self.results.path, summary)
            self._ranges = read_source_ranges(self.results.path, summary)
            self._digest = summary['source_sha256']
        return encode_png(render_followup(self._source, record, summary.get('warp', 'fused'), self._ranges))


def _box_scale(results: _Results, record: dict, png: bytes | None) -> tuple[float, float] | None:
    """The follow-up PNG's pixels per source-frame pixel (a detection record's boxes are in the
    latter; the PNG is at the working size); None when not a detection, or no summary says the size."""
    if png is None or record.get('kind') != 'detection':
        return None
    summary = results.summary_of(record) or {}
    source, size = summary.get('source_size') or (0, 0), image_size(png)
    if size is None or not all(source):
        return None
    return size[0] / source[0], size[1] / source[1]


def _png(results: _Results, relative: str) -> bytes:
    """A follow-up PNG's bytes, checked whole (signature, chunk CRCs, IEND) before they are exported."""
    path = results.path / relative
    if not path.is_file():
        raise ResultsError(f'{results.path}: {relative} is named by a record but missing')
    data = path.read_bytes()
    problem = check_png(data) if data.startswith(b'\x89PNG\r\n\x1a\n') else 'not a PNG'
    if problem:
        raise ResultsError(f'{path}: damaged follow-up frame ({problem})')
    return data


def export_mcap(
    results_dir: str | Path,
    out: str | Path,
    *,
    bag: str | Path | None = None,
    overwrite: bool = False,
    log: Callable[[str], None] | None = None,
) -> ExportResult:
    """Write a results directory (and optionally its footage bag) to one MCAP file.

    Everything is read and verified first; the MCAP is written beside `out` under a hidden name and
    renamed in at the end, so `out` is either the whole export or untouched. Every violation gets
    its follow-up: the kept PNG, else one rendered (method/render.py) from its search's stored source
    frame; searches that stored none (older results, a refused budget, cut short) keep the record only.

    Args:
        results_dir: A results directory, or a folder of them (a demo, a campaign).
        out: The MCAP file to write.
        bag: The footage bag the results were searched on: its topics are merged, and its frames
            must match the results' `frame_sha256`.
        overwrite: Replace an existing `out`.
        log: Called with progress lines.

    Returns:
        What was written.

    Raises:
        InputError: Not a results directory; a bag whose frames do not match the results.
        ResultsError: A damaged results file, identity record, PNG or campaign cell.
        BagError: A damaged or unreadable bag.
        ParameterError: `out` exists and `overwrite` is false, or is a directory.
    """
    out = Path(out)
    if out.is_dir():
        raise ParameterError(f'{out}: is a directory; name the .mcap file to write')
    if out.exists() and not overwrite:
        raise ParameterError(f'{out} already exists; pass --overwrite to replace it')
    if not out.parent.is_dir():
        raise ParameterError(f'{out.parent}: no such directory')
    sets = [_read_results(path, prefix) for path, prefix in find_results(results_dir)]
    for results in sets:  # checked first; read again when written, so that memory stays small
        for relative in results.frames.values():
            _png(results, relative)
        for digest, summary in {s.get('source_sha256'): s for s in results.finished.values()}.items():
            if digest:
                _source_png(results, summary)
    bag_frames: dict[int, bytes] = {}
    if bag is not None:
        from metavlm_ros.viewer.bag_merge import check_bag_frames

        bag_frames = check_bag_frames(bag, _stamped_digests(sets))
    partial = out.parent / f'.{out.name}.partial-{os.getpid()}-{secrets.token_hex(4)}'
    result = ExportResult(out, [str(r.path) for r in sets])
    try:
        _write(partial, Path(results_dir), sets, bag, bag_frames, result)
        os.replace(partial, out)
    finally:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
    result.bytes = out.stat().st_size
    if log:
        log(
            f'{out}: {result.violations} violation(s), {result.followups} follow-up frame(s) '
            f'({result.rendered} rendered from stored source frames), '
            f'{result.sources} source frame(s), {result.summaries} search summar(ies)'
            + (
                f'; {result.unrendered} violation(s) of searches without a stored source frame '
                'have no follow-up image'
                if result.unrendered
                else ''
            )
            + (f', {result.bag_messages} bag message(s)' if bag is not None else '')
        )
    return result


def _stamped_digests(sets: list[_Results]) -> dict[int, str]:
    """Camera stamp -> frame hash of every searched frame that has a camera stamp."""
    wanted: dict[int, str] = {}
    for results in sets:
        for record in [*results.violations, *results.summaries]:
            stamp = record.get('source_stamp') or record.get('stamp_ns')
            digest = record.get('frame_sha256')
            if stamp and digest:
                wanted[int(stamp)] = digest
    return wanted


def _write(
    partial: Path,
    root: Path,
    sets: list[_Results],
    bag: str | Path | None,
    bag_frames: dict[int, bytes],
    result: ExportResult,
) -> None:
    # A context of our own: channels of another export or a live server in this process stay apart.
    context = foxglove.Context()
    options = MCAPWriteOptions(profile='', compression_threads=0)
    writer = foxglove.open_mcap(partial, allow_overwrite=True, context=context, writer_options=options)
    with writer:
        now = time.time_ns()
        for report in REPORTS:
            _attach(writer, root / report, report, now)
        for results in sets:
            channels = ViolationChannels(context, results.prefix)
            _write_identity(writer, results, now)
            renderer = _Renderer(results)
            for record in results.violations:
                stamp = time_of(record, results.searches)
                relative = results.frames.get(record_key(record))
                png = _png(results, relative) if relative else renderer.followup(record)
                channels.log_violation(record, stamp, png, box_scale=_box_scale(results, record, png))
                result.violations += 1
                result.followups += png is not None
                result.rendered += png is not None and not relative
                result.unrendered += png is None
            counts: dict[tuple, int] = {}
            for record in results.violations:
                key = record_key(record)[:-1]
                counts[key] = counts.get(key, 0) + 1
            for summary in results.summaries:
                stamp = time_of(summary, results.searches)
                channels.log_summary(summary, counts.get(record_key(summary)[:-1], 0), stamp)
                result.summaries += 1
            result.sources += _write_sources(channels, results, bag_frames)
        if bag is not None:
            from metavlm_ros.viewer.bag_merge import merge_bag

            result.bag_messages = merge_bag(bag, context)


def _write_sources(channels: ViolationChannels, results: _Results, bag_frames: dict[int, bytes]) -> int:
    """Each searched frame once, at its time: the bag's own pixels, else the stored source frame."""
    stored: dict[int, dict] = {}
    for summary in results.finished.values():
        if summary.get('source_frame'):
            stored.setdefault(time_of(summary, results.searches), summary)
    stamps = {time_of(r, results.searches) for r in [*results.violations, *results.summaries]}
    logged = 0
    for stamp in sorted(stamps):
        png = bag_frames.get(stamp)
        if png is None and stamp in stored:
            # Its pixels were checked before writing began; the chunk CRCs catch a change since.
            png = _source_png(results, stored[stamp], pixels=False)
        if png is not None:
            channels.log_source(stamp, png)
            logged += 1
    return logged


def _write_identity(writer: foxglove.mcap.MCAPWriter, results: _Results, now: int) -> None:
    """The directory's identity as MCAP metadata (flat strings) and its record files as attachments."""
    name = results.prefix.strip('/').replace('/', '.')
    if results.identity is not None:
        writer.write_metadata(f'{name}.identity', _flat(results.identity))
    for path in (results.path / IDENTITY, records_file(results.path / SUMMARY), results.path / CELL_FILE):
        _attach(writer, path, f'{name}/{path.name}', now)


def _attach(writer: foxglove.mcap.MCAPWriter, path: Path, name: str, now: int) -> None:
    if not path.is_file():
        return
    media = {'.md': 'text/markdown', '.jsonl': 'application/jsonl', '.gz': 'application/gzip'}.get(
        path.suffix, 'application/json'
    )
    writer.attach(
        log_time=now, create_time=path.stat().st_mtime_ns, name=name, media_type=media, data=path.read_bytes()
    )


def _flat(value: object, prefix: str = '') -> dict[str, str]:
    if isinstance(value, dict):
        flat: dict[str, str] = {}
        for key, item in value.items():
            flat.update(_flat(item, f'{prefix}.{key}' if prefix else str(key)))
        return flat
    return {prefix: value if isinstance(value, str) else json.dumps(value)}
