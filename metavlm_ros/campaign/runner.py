"""Campaigns: every (model, algorithm, run, image) search run as a resumable cell, locally or on Dask."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from metavlm_ros import __version__
from metavlm_ros.campaign.cells import (
    CAMPAIGN_FILE,
    CELLS_DIR,
    UNVERIFIED,
    CampaignImage,
    Cell,
    finished_cells,
    load_images,
    plan_cells,
    read_campaign,
    verify_cell,
)
from metavlm_ros.campaign.config import EXECUTORS, CampaignConfig, ModelSpec, sha256_text
from metavlm_ros.campaign.executors import CellTask, commit_cell, run_cell, run_dask, run_pool, write_synced
from metavlm_ros.common.errors import InputError, ParameterError, ResultsError
from metavlm_ros.common.images import encode_png
from metavlm_ros.common.manifest import MANIFEST, check_manifest, write_manifest
from metavlm_ros.common.results import check_output_dir, storage_error, write_file_atomic

__all__ = ['CampaignRun', 'model_identity', 'run_campaign']

FRAMES_DIR = 'frames'
LOCK_FILE = '.lock'
FORMAT = 1


# ---------------------------------------------------------------------------------------------------
# Configuration


# ---------------------------------------------------------------------------------------------------
# Images and cells


# ---------------------------------------------------------------------------------------------------
# Running one cell (on any worker)


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
    """The model's name, id, directory on this machine (None for a served one), the sha256 of its weights,
    its options and what its backend adds (models/vlm.py model_identity)."""
    from metavlm_ros.models.registry import BACKENDS
    from metavlm_ros.models.vlm import model_identity as identity_of
    from metavlm_ros.models.vlm import resolve_model

    local = BACKENDS[spec.backend].local_model
    return {
        'name': spec.name,
        'directory': resolve_model(spec.backend, spec.model) if local else None,
        **identity_of(spec.backend, spec.model, spec.options),
    }


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
            **({'ranges_sha256': im.ranges_sha256} if im.ranges is not None else {}),
        }
        for im in images
    ]
    identity = {
        'config': config.identity(),
        'models': [m['weights_sha256'] for m in identities],
        'images': [im['sha256'] for im in image_records],
    }
    ranges = [im['ranges_sha256'] for im in image_records if 'ranges_sha256' in im]
    if ranges:  # changed range maps change the follow-ups of MR12; campaigns without them keep theirs
        identity['ranges'] = ranges
    return {
        'format': FORMAT,
        'package': 'metavlm_ros',
        'version': __version__,
        'fingerprint': sha256_text(json.dumps(identity, sort_keys=True))[:16],
        'created': time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()),
        'config': config.to_dict(),
        'models': identities,
        'images': image_records,
        'cells': cells,
        'invocations': [],
    }


def _write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(f'.{path.name}.tmp')
    write_synced(tmp, (json.dumps(data, indent=1, sort_keys=True) + '\n').encode())
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

    images = load_images(config.frames, config.water_ranges)  # a frame without its map: refused here
    cells = plan_cells(config, images)
    identities = [model_identity(spec) for spec in config.models]
    record = _campaign_record(config, images, identities, len(cells))
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise storage_error(out, exc) from None
    with _exclusive(out):
        try:
            _withdraw_manifest(out, log)
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

        frames = _searched_frames(config, images)
        if threads is None:
            threads = config.threads
        models = config.models
        by_index = {im.index: im for im in images}
        tasks = []
        for c in pending:
            image = by_index[c.image_index]
            search = _search_for(config, c)
            tasks.append(
                CellTask(
                    c, models[c.model_index], search, threads, image.stamp_ns, image.file, image.frame_index
                )
            )
        started = time.perf_counter()
        completed = 0
        bar = _progress_bar(len(cells), skipped, progress)
        try:
            if executor == 'dask':
                runner = run_dask(tasks, frames, workers, scheduler, config, log)
            elif workers > 1:
                runner = run_pool(tasks, frames, workers)
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
            # Last, over the whole campaign as this run leaves it: `sha256sum -c SHA256SUMS` there.
            write_manifest(out)
        except OSError as exc:
            raise storage_error(out / CAMPAIGN_FILE, exc) from None
    return CampaignRun(directory=out, total=len(cells), skipped=skipped, completed=completed, seconds=seconds)


def _withdraw_manifest(out: Path, log) -> None:
    """Remove the campaign's SHA256SUMS before anything there changes: a run cut short leaves no manifest
    (its evidence says 'not verified'), never one that lists another state. One that no longer matched
    is said, since the manifest the run ends with lists the campaign as it is then."""
    path = out / MANIFEST
    if not path.is_file():
        return
    try:
        check_manifest(out)
    except ResultsError as exc:
        log(f'{MANIFEST} did not match ({exc}); this run writes it anew over the campaign as it leaves it')
    path.unlink()


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


def _searched_frames(config: CampaignConfig, images: Sequence[CampaignImage]) -> dict:
    """Each image as its cells search it (a PreparedFrame: at the working size, with its range map where
    MR12 takes the footage's ranges), made once and sent to every cell of the image (Dask scatters it).

    One preparation serves all of an image's cells: they differ in algorithm and seed only, and a
    campaign's working size is pixels or the full frame, never the model-dependent 'auto'.
    """
    from metavlm_ros.method.search import prepare_frame

    search = config.search_config(config.algorithms[0], config.seed)
    return {im.index: prepare_frame(im.rgb, search, ranges=im.ranges) for im in images}


def _previous_record(out: Path) -> dict | None:
    """The campaign record a results directory already holds (None: none yet).

    Raises:
        ParameterError: It is unreadable or not a mapping.
    """
    if not (out / CAMPAIGN_FILE).exists():
        return None
    try:
        return read_campaign(out)
    except InputError as exc:
        raise ParameterError(f'{exc}; use another --out') from None


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
    write_file_atomic(path, encode_png(rgb))


def _progress_bar(total: int, initial: int, enabled: bool):
    from tqdm import tqdm

    # stderr: stdout stays for results and summaries.
    return tqdm(
        total=total, initial=initial, unit='cell', desc='campaign', disable=not enabled, file=sys.stderr
    )
