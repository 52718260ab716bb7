"""A catalogue kept current as evidence grows (explain/tracker.py): exactly `metavlm modes` while the
sample holds everything, a bounded uniform sample past it, and the same modes from either."""

from __future__ import annotations

from metavlm_ros.common.record_format import iter_jsonl
from metavlm_ros.common.results import EVALUATIONS, SUMMARY
from metavlm_ros.explain.catalogue import CatalogueSettings
from metavlm_ros.explain.modes import catalogue_of
from metavlm_ros.explain.tracker import ModeTracker

SETTINGS = CatalogueSettings(threshold=0.05)


def _by_search(directory):
    """The directory's searches one by one, as a tester hands them over: (summary, its records)."""
    records = list(iter_jsonl(directory / EVALUATIONS))
    for summary in iter_jsonl(directory / SUMMARY):
        yield summary, [r for r in records if r['image'] == summary['image']]


def test_search_by_search_it_learns_what_metavlm_modes_learns_from_the_directory(planted_results):
    tracker = ModeTracker(planted_results, SETTINGS, capacity=10_000)
    for summary, records in _by_search(planted_results):
        tracker.add_search([summary], records)
    learnt = tracker.learn()
    whole = catalogue_of([planted_results], SETTINGS)
    assert learnt.sampled == learnt.seen == whole.evaluations == 1800
    assert [m.as_record(k) for k, m in enumerate(learnt.catalogue.modes)] == [
        m.as_record(k) for k, m in enumerate(whole.modes)
    ]
    # Violations: the evaluations with an answer change, as the records flag them at the threshold.
    flagged = sum(r['violation']['0.05'] for r in iter_jsonl(planted_results / EVALUATIONS) if r['order'])
    assert learnt.violations == flagged and tracker.pending == 0


def test_past_its_capacity_it_keeps_a_uniform_sample_and_finds_the_same_modes(planted_results):
    tracker = ModeTracker(planted_results, SETTINGS, capacity=900)
    tracker.load()
    learnt = tracker.learn()
    assert (learnt.seen, learnt.sampled, learnt.catalogue.evaluations) == (1800, 900, 900)
    # Every search is in a uniform half of its evaluations, about half of each (a binomial's 4 sigma).
    counts = {}
    for record in tracker.sample:
        counts[record['image']] = counts.get(record['image'], 0) + 1
    assert len(counts) == 6 and all(abs(n - 150) <= 4 * 150**0.5 / 2**0.5 for n in counts.values()), counts
    # The planted modes, each named as from the whole evidence, their rates within a few points.
    whole = {m.change.label: m for m in catalogue_of([planted_results], SETTINGS).modes}
    sampled = {m.change.label: m for m in learnt.catalogue.modes}
    assert set(sampled) == set(whole) == {'trash dropped', 'animal rose'}
    for label, mode in sampled.items():
        assert [c.feature.name for c in mode.conditions] == [c.feature.name for c in whole[label].conditions]
        assert abs(mode.rate_inside - whole[label].rate_inside) < 0.05
    # Nothing new: nothing pending; the next catalogue waits for new violations.
    assert tracker.pending == 0
