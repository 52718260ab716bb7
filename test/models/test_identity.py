"""The identity record's one shape (models/identity.py): settings, model and source parts."""

import pytest

from metavlm_ros.common.record_format import SEARCH_SOURCE
from metavlm_ros.method.search import SearchConfig
from metavlm_ros.models.identity import answered_model_identity, identity_record, model_identity


def test_a_search_record_holds_the_settings_the_model_and_the_search_source(tiny_clip_dir):
    config = SearchConfig(population=4, evaluations=8).validate()
    model = model_identity('clip', str(tiny_clip_dir), {'device': 'cpu'})
    record = identity_record(config, model)
    assert record == {'settings': config.identity(), 'model': model, 'source': dict(SEARCH_SOURCE)}
    assert len(model['weights_sha256']) == 64 and model['architectures'] == ['CLIPModel']
    # A tester names how its frames came; a field the record does not have is a mistake, not a record.
    tester = identity_record(config, model, {'endpoint': 'ros', 'transport_size': 384})
    assert tester['source'] == {**SEARCH_SOURCE, 'endpoint': 'ros', 'transport_size': 384}
    with pytest.raises(ValueError, match='transport'):
        identity_record(config, model, {'transports': 384})


def test_a_model_known_by_its_answers_has_the_keys_of_one_read_from_disk(tiny_clip_dir):
    answered = answered_model_identity('demo-clip', ('animal', 'trash'))
    assert answered == {
        'backend': None,
        'model': 'demo-clip',
        'weights_sha256': None,
        'options': {'classes': ['animal', 'trash']},
    }
    read = model_identity('clip', str(tiny_clip_dir), {})
    assert set(answered) <= set(read) and 'classes' in read['options']
