"""The wording of the failure modes that break a failing criterion, as the verdict's files show it."""

from pathlib import Path

from metavlm_ros.explain.catalogue import Catalogue, CatalogueSettings
from metavlm_ros.explain.verdicts import Broken, FailingModes


def test_a_failing_criterion_no_mode_holds_says_so_and_nothing_learnt_names_nothing(tmp_path):
    catalogue = Catalogue([], CatalogueSettings(threshold=0.05), evaluations=40, violations={})
    files = [tmp_path / 'modes' / name for name in ('modes.json', 'modes.md', 'modes.html')]
    named = FailingModes(catalogue, [Broken('anything', 4, ())], files).for_verdict()
    assert named is not None
    assert dict(named.lines) == {'anything': ('no mode holds its 4 violations',)}
    assert named.catalogue == Path(tmp_path / 'modes' / 'modes.md')
    assert FailingModes(None).for_verdict() is None
