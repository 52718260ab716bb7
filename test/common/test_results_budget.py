"""The results directory's disk budget: past it no PNGs, records go on, nothing deleted; its write rate."""

import json
import math

import numpy as np

from metavlm_ros.common.results import ResultsStore, WriteRate, read_jsonl, records_file
from metavlm_ros.method.search import SearchConfig, evaluation_record, run_search
from test.fakes import ImageStatsBackend


def _noise(width=256, height=192, seed=0):
    # Noise does not compress: each PNG is about width * height * 3 bytes.
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def test_past_the_budget_no_png_is_written_and_records_go_on(tmp_path):
    frame = _noise()
    config = SearchConfig(population=10, evaluations=40, seed=1, pareto_pngs='all')
    with ResultsStore(tmp_path / 'out') as store:
        # Room for the source frame and half a follow-up: the first follow-up crosses the budget.
        store.max_bytes = store.size_bytes + frame.nbytes * 3 // 2
        result = run_search(frame, ImageStatsBackend(), config, image_id='f', store=store)
        distinct = {result.evaluations[i].composition.key for i in result.pareto}
        assert len(distinct) >= 3, 'too small a front to check the budget'
        assert store.over_budget() and store.frames_over_budget == len(distinct) - 1
    assert len(read_jsonl(tmp_path / 'out' / 'evaluations.jsonl')) == 40
    assert len(read_jsonl(tmp_path / 'out' / 'summary.jsonl')) == 1
    written = [p['frame'] for p in read_jsonl(tmp_path / 'out' / 'pareto.jsonl') if p['frame']]
    assert len(set(written)) == 1 and len(list((tmp_path / 'out' / 'sources').iterdir())) == 1
    # What the directory holds is what the store counted: every byte it wrote, nothing deleted.
    on_disk = sum(p.stat().st_size for p in (tmp_path / 'out').rglob('*') if p.is_file())
    assert on_disk == store.size_bytes


def test_a_budget_counts_what_the_directory_held_before(tmp_path):
    with ResultsStore(tmp_path / 'out') as store:
        store.save_frame('a', _noise())
    with ResultsStore(tmp_path / 'out', max_bytes=_noise().nbytes // 2) as store:
        assert store.initial_bytes > store.max_bytes and store.over_budget()
        assert store.save_frame('b', _noise(seed=1)) is None and store.save_source(_noise(seed=2)) is None
        store.append_evaluation({'image': 'x', 'index': 0})
        assert store.frames_over_budget == 2
    assert (tmp_path / 'out' / 'frames' / 'a.png').is_file() and read_jsonl(
        tmp_path / 'out' / 'evaluations.jsonl'
    )
    with ResultsStore(tmp_path / 'out') as store:
        assert not store.over_budget()  # 0: no budget


def test_the_write_rate_and_the_hours_left():
    rate = WriteRate(window_s=120)
    assert math.isnan(rate.update(0, now=0.0))
    assert rate.update(2_000_000, now=60.0) == 2.0  # MB per minute
    assert rate.update(4_000_000, now=120.0) == 2.0
    # The window (two minutes) forgets the old pace.
    assert rate.update(14_000_000, now=180.0) == 6.0 and rate.update(14_000_000, now=240.0) == 5.0
    assert rate.update(14_000_000, now=360.0) == 0.0  # nothing in the last two minutes
    assert WriteRate.hours_left(14_000_000, 14_000_000 + 120_000_000, 2.0) == 1.0
    assert math.isnan(WriteRate.hours_left(1, 0, 2.0)) and math.isnan(
        WriteRate.hours_left(1, 10, float('nan'))
    )
    assert WriteRate.hours_left(1, 10, 0.0) == math.inf and WriteRate.hours_left(20, 10, 1.0) == 0.0
    assert WriteRate.hours_left(20, 10, float('nan')) == 0.0  # reached: known without a rate


def _tester_like(directory, format_2: bool) -> None:
    """A search with every violation published, as the tester writes them; in format 2 when the directory
    is one an earlier version started (its evaluations.jsonl)."""
    if format_2:
        directory.mkdir(parents=True)
        (directory / 'evaluations.jsonl').touch()
    config = SearchConfig(population=10, evaluations=60, seed=1, pareto_pngs=0)
    with ResultsStore(directory) as store:

        def on_evaluation(ev, result):
            if any(ev.violation.values()):
                store.append_violation({**evaluation_record(ev, result), 'frame': None})

        run_search(_noise(64, 48), ImageStatsBackend(), config, image_id='f', store=store,
                   on_evaluation=on_evaluation)  # fmt: skip


def _bytes_per_record(directory, name) -> tuple[float, float]:
    """(bytes a record takes on disk, bytes of the record whole on its own line, uncompressed)."""
    records = read_jsonl(directory / name)
    whole = sum(len(json.dumps(r, separators=(',', ':'))) + 1 for r in records) / len(records)
    return records_file(directory / name).stat().st_size / len(records), whole


def test_format_3_compresses_whole_records_in_members_of_a_generation(tmp_path):
    _tester_like(tmp_path / 'out', format_2=False)
    # A generation of 10 evaluations a member; a violation a member of its own (published at once).
    for name, most in (('evaluations.jsonl', 0.45), ('pareto.jsonl', 0.45), ('violations.jsonl', 0.75)):
        stored, whole = _bytes_per_record(tmp_path / 'out', name)
        assert stored < most * whole, (name, stored, whole)


def test_pareto_and_violation_lines_repeat_nothing_that_evaluations_hold_in_format_2(tmp_path):
    # Issue 30: a front member or a published violation is its evaluation's index (and rank, PNG);
    # an evaluation line holds what is its own, not its search's fields nor the usual values.
    _tester_like(tmp_path / 'out', format_2=True)
    # Bytes a record takes against its whole line: a float64 model's evaluations save the least.
    for name, most in (('pareto.jsonl', 0.05), ('violations.jsonl', 0.05), ('evaluations.jsonl', 0.75)):
        path = tmp_path / 'out' / name
        records = read_jsonl(path)
        whole = sum(len(json.dumps(r, separators=(',', ':'))) + 1 for r in records) / len(records)
        header = len(path.read_bytes().splitlines(keepends=True)[0])
        stored = (path.stat().st_size - header) / len(records)
        assert stored < most * whole, (name, stored, whole)
