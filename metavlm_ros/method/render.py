"""Follow-up frames made again, byte for byte, from a search's stored source frame and its records."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from metavlm_ros.common.errors import ParameterError, ResultsError
from metavlm_ros.common.range_maps import read_source_ranges
from metavlm_ros.common.results import EVALUATIONS, SUMMARY, iter_jsonl, read_source_frame, search_key
from metavlm_ros.method.encoding import Composition
from metavlm_ros.method.relations import apply_composition

__all__ = ['find_search', 'render_followup', 'render_search', 'search_evaluations']

# The filters a caller may give to pick one search of a directory, by summary field.
FILTERS = ('image', 'algorithm', 'seed', 'run')


def find_search(directory: str | Path, **filters: object) -> dict:
    """The summary record of the one finished search of `directory` that matches `filters`.

    Args:
        directory: A results directory (`metavlm search`, a tester's, a campaign cell, a demo's).
        filters: summary field -> value (image, algorithm, seed, run); None matches anything.

    Raises:
        ResultsError: The directory holds no finished search, or none or several match (named).
    """
    directory = Path(directory)
    summaries = [s for s in iter_jsonl(directory / SUMMARY) if not s.get('stopped')]
    if not summaries:
        raise ResultsError(f'{directory}: holds no finished search (no {SUMMARY} record)')
    wanted = {k: v for k, v in filters.items() if v is not None}
    matching = [s for s in summaries if all(str(s.get(k)) == str(v) for k, v in wanted.items())]
    if len(matching) == 1:
        return matching[0]
    named = '; '.join(
        f'--image {s.get("image")} --algorithm {s.get("algorithm")} --seed {s.get("seed")}'
        + (f' --run {s.get("run")}' if s.get('run') is not None else '')
        for s in (matching or summaries)[:5]
    )
    count = 'none' if not matching else f'{len(matching)}'
    raise ResultsError(f'{directory}: {count} of its {len(summaries)} searches match; pick one: {named}')


def search_evaluations(directory: str | Path, summary: dict, indices: Iterable[int]) -> dict[int, dict]:
    """The evaluation records of a search by index, checked: every index must be there.

    Raises:
        ResultsError: An index the search did not evaluate.
    """
    wanted = set(indices)
    key = search_key(summary)
    # A summary names its model even where the records do not (a search run without extra fields).
    loose = (*key[:3], None, key[4])
    found = {}
    for record in iter_jsonl(Path(directory) / EVALUATIONS):
        if record.get('index') in wanted and search_key(record) in (key, loose):
            found.setdefault(record['index'], record)
    missing = sorted(wanted - set(found))
    if missing:
        raise ResultsError(
            f'{directory}: the search of {summary.get("image")} has no evaluation {missing[0]} '
            f'(it made {summary.get("evaluations")}, numbered from 0)'
        )
    return found


def render_followup(
    source: np.ndarray, record: dict, warp: str, ranges: np.ndarray | None = None
) -> np.ndarray:
    """The follow-up frame of one evaluation record, as its search made it.

    Args:
        source: The search's source frame as searched (`read_source_frame`).
        record: The evaluation record (its `parameters`: relation id -> value, exact as stored).
        warp: The search's warp setting (`fused` or `sequential`, its summary's `warp`).
        ranges: The range map the search used (`read_source_ranges`), None where it used none.

    Raises:
        ParameterError: The record's parameters name no known relation or lie outside its range.
    """
    parameters = record.get('parameters')
    if not isinstance(parameters, dict):
        raise ParameterError(f'evaluation {record.get("index")}: no parameters to render')
    composition = Composition.from_parameters(parameters)
    return apply_composition(source, composition, fuse=warp == 'fused', ranges=ranges)


def render_search(directory: str | Path, summary: dict, indices: Sequence[int]) -> dict[int, np.ndarray]:
    """Render the follow-ups of `indices` of one search (the summary's), by index.

    Raises:
        ResultsError, ParameterError: see read_source_frame, search_evaluations, render_followup.
    """
    source = read_source_frame(directory, summary)
    ranges = read_source_ranges(directory, summary)
    records = search_evaluations(directory, summary, indices)
    warp = summary.get('warp', 'fused')
    return {i: render_followup(source, records[i], warp, ranges) for i in indices}
