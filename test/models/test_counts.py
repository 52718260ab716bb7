"""Tests of the count parser on hand-written VLM answers."""

import pytest

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.method.prediction import CLASSES
from metavlm_ros.models.counts import DEFAULT_VOCABULARIES, parse_counts


def counts(animal=0, vegetation=0, object=0, trash=0):  # noqa: A002 -- the paper's class name
    return {'animal': animal, 'vegetation': vegetation, 'object': object, 'trash': trash}


def test_default_classes_are_table1_labels():
    assert CLASSES == ('animal', 'vegetation', 'object', 'trash')
    assert set(DEFAULT_VOCABULARIES) == set(CLASSES)


@pytest.mark.parametrize(
    ('text', 'expected'),
    [
        # The example of the issue: items of a section add up; None is zero.
        ('Animals: 2 fish, 1 crab Vegetation: None Objects: 1 pipe Trash: 3 bottles', counts(3, 0, 1, 3)),
        # Singular headers, lower case, number words, 'a', 'no' and '0'.
        ('animal: two fish and a crab. vegetation: none. objects: no. trash: 0', counts(3, 0, 0, 0)),
        ('ANIMALS: ONE STARFISH VEGETATION: SEVERAL SEAWEED', counts(1, 3, 0, 0)),
        # Missing sections count zero.
        ('Trash: 4 cans', counts(trash=4)),
        # A kind without a number says one is there; a number without a kind counts as given.
        ('Animals: octopus Vegetation: kelp, seagrass Objects: 3', counts(1, 2, 3, 0)),
        # Items from another class's vocabulary count towards the section they are listed under.
        ('Objects: 2 bottles, a rope', counts(object=3)),
        ('Animals: 2 fish swimming in a group', counts(animal=2)),
        ('Trash: a dozen bottles, twenty cans', counts(trash=32)),
        ('Trash: 5 Tyres, 2 tires and a plastic bag', counts(trash=8)),
        # Text before the first header is ignored; headers with 'n/a' or echoed placeholders count zero.
        ('Answer: Animals: 3 Vegetation: 12 Objects: N/A Trash: <number> <kind>, ...', counts(3, 12, 0, 0)),
        # Header aliases.
        ('Plants: 2 Litter: 1 can', counts(vegetation=2, trash=1)),
        ('Animals: 12 fish', counts(animal=12)),
    ],
)
def test_table1_format(text, expected):
    assert parse_counts(text) == expected


@pytest.mark.parametrize(
    ('text', 'expected'),
    [
        ('two fish swimming near a plastic bottle', counts(animal=2, trash=1)),
        ('a diver next to an anchor and some kelp', counts(animal=1, vegetation=1, object=1)),
        # 'can' the verb is not a can; 'three cans' is.
        ('you can see three cans and a tyre on the sand', counts(trash=4)),
        ('no fish, just a rope', counts(object=1)),
        ('a couple of jellyfish and a few starfishes', counts(animal=5)),
        ('three small yellow fish', counts(animal=3)),
        ('fishes near seagrass', counts(animal=1, vegetation=1)),
        ('there are no animals in this picture', counts()),
        ('a sea urchin beside a fishing net', counts(animal=1, trash=1)),
        ('sand and rocks', counts()),
        ('', counts()),
    ],
)
def test_unstructured_captions(text, expected):
    assert parse_counts(text) == expected


def test_custom_vocabulary_replaces_that_class_only():
    text = 'three sharks and a bucket near a wreck'
    assert parse_counts(text) == counts(animal=3, object=1)
    assert parse_counts(text, vocabularies={'trash': ['bucket']}) == counts(animal=3, object=1, trash=1)
    # The animal vocabulary replaced: sharks are no longer animals.
    assert parse_counts(text, vocabularies={'animal': ['dolphin']}) == counts(object=1)


def test_custom_classes_use_their_names_as_headers_and_kinds():
    assert parse_counts('Fish: 3 Rocks: 2 stones', classes=('fish', 'rock')) == {'fish': 3, 'rock': 2}
    assert parse_counts('two fish and a rock', classes=('fish', 'rock')) == {'fish': 2, 'rock': 1}
    found = parse_counts('a crab on a stone', classes=('crustacean',), vocabularies={'crustacean': ['crab']})
    assert found == {'crustacean': 1}


def test_multiword_kinds_take_the_longest_match():
    # 'plastic bag' is one trash item, not plastic (trash) plus bag (trash).
    assert parse_counts('two plastic bags') == counts(trash=2)
    assert parse_counts('a rov part') == counts(object=1)


def test_bad_configuration_raises_parameter_error():
    with pytest.raises(ParameterError, match='unknown class'):
        parse_counts('a fish', vocabularies={'mammal': ['seal']})
    with pytest.raises(ParameterError, match='at least one class'):
        parse_counts('a fish', classes=())
