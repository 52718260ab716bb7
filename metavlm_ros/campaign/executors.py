"""Campaign executors: one cell run on any worker, committed atomically; local processes or Dask."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from metavlm_ros.campaign.cells import CELL_FILE, CELLS_DIR, Cell, safe_name
from metavlm_ros.campaign.config import CampaignConfig, ModelSpec, sha256_text
from metavlm_ros.common.errors import ParameterError

if TYPE_CHECKING:  # pymoo loads slowly: the search is imported where a cell runs
    from metavlm_ros.method.search import PreparedFrame

__all__ = [
    'CellOutcome',
    'CellTask',
    'SCRATCH_PREFIX',
    'commit_cell',
    'run_cell',
    'run_dask',
    'run_pool',
    'task_resources',
    'write_synced',
]

# Scratch folders of running cells in $TMPDIR: .metavlm-cell-<host>.partial-<pid>-<token>.
SCRATCH_PREFIX = 'metavlm-cell-'


@dataclass
class CellTask:
    """What a worker needs to run one cell; the frame travels separately (Dask scatters it once)."""

    cell: Cell
    model: ModelSpec
    search: Any  # SearchConfig
    threads: int | None = None
    stamp_ns: int = 0
    #: Where the frame came from: file and position ('' for generated scenes: no field in the records).
    frame_file: str = ''
    frame_index: int = 0


@dataclass
class CellOutcome:
    """What a worker hands back: the cell's files (relative path -> bytes) and its timing."""

    cell: Cell
    files: dict[str, bytes]
    timing: dict


@functools.lru_cache(maxsize=4)
def _backend_for(key: str):
    """The backend of a model spec, built once per worker process (cells reuse it)."""
    from metavlm_ros.models.vlm import create_backend

    spec = ModelSpec(**json.loads(key))
    return create_backend(spec.backend, spec.model, **spec.options)


def run_cell(task: CellTask, frame: PreparedFrame | np.ndarray) -> CellOutcome:
    """Run one cell's search into a private scratch folder and return its files.

    Runs in whatever process the executor chose; nothing is written to the results directory here,
    so a worker on another machine needs no shared file system. `frame` is the image as the cell
    searches it (the runner's PreparedFrame, with its range map where MR12 takes the footage's
    ranges: the search stores the map beside its source frame), or an RGB frame it prepares.
    """
    from metavlm_ros.common.results import ResultsStore
    from metavlm_ros.method.search import run_search

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
    from metavlm_ros.common.scratch import scratch_path

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
                    **(
                        {'frame_file': task.frame_file, 'frame_index': task.frame_index}
                        if task.frame_file
                        else {}
                    ),
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
    return f'{SCRATCH_PREFIX}{safe_name(socket.gethostname())}'


@functools.lru_cache(maxsize=1)
def _remove_stale_scratch() -> list[Path]:
    """Remove (once per process) the scratch folders that killed cells left in the temporary directory:
    only those this code names, made on this host by a process that no longer runs."""
    from metavlm_ros.common.scratch import remove_stale

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
    info['checksum'] = sha256_text(json.dumps(info, sort_keys=True))
    try:
        for name, data in outcome.files.items():
            target = scratch / name
            target.parent.mkdir(parents=True, exist_ok=True)
            write_synced(target, data)
        write_synced(scratch / CELL_FILE, (json.dumps(info, indent=1, sort_keys=True) + '\n').encode())
        os.rename(scratch, final)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)  # a full disk leaves no half-written cell behind
        raise
    _fsync_dir(cells_dir)
    return final


def write_synced(path: Path, data: bytes) -> None:
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


def run_pool(tasks: list[CellTask], frames: dict, workers: int) -> Iterator[CellOutcome]:
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


def run_dask(
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
        scattered = {index: client.scatter(frame, broadcast=False) for index, frame in frames.items()}
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
