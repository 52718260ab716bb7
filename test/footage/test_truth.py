"""Ground truth (footage/truth.py): the Table 1 caption and the record's round trip."""

import json

from metavlm_ros.footage.scenes import SceneGenerator
from metavlm_ros.footage.truth import KIND_CLASS, GroundTruth, caption


def test_caption_format():
    kinds = {k: 0 for k in KIND_CLASS}
    kinds.update(fish=2, crab=1, seaweed=1, bottle=1)
    gt = GroundTruth(counts={'animal': 3, 'vegetation': 1, 'object': 0, 'trash': 1}, kind_counts=kinds)
    assert caption(gt) == 'Animals: 2 fish, 1 crab Vegetation: 1 seaweed Objects: None Trash: 1 bottle'
    kinds.update(fish=0, crab=3, rov=1, box=2, tyre=2)
    gt = GroundTruth(counts={'animal': 3, 'vegetation': 1, 'object': 3, 'trash': 3}, kind_counts=kinds)
    assert (
        caption(gt)
        == 'Animals: 3 crabs Vegetation: 1 seaweed Objects: 2 boxes, 1 rov Trash: 1 bottle, 2 tyres'
    )


def test_ground_truth_dict_round_trip():
    gt = SceneGenerator(128, 72, 5, seed=9, environment='pool').frame(3)[1]
    data = json.loads(json.dumps(gt.to_dict()))
    assert data['frame_index'] == 3 and data['environment'] == 'pool'
    assert GroundTruth.from_dict(data).to_dict() == gt.to_dict()
