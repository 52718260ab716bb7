"""The tester node with an in-process stand-in model: violations, images, diagnostics, drops, parameters."""

import shutil
import threading
from pathlib import Path

import cv2
import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from rclpy.executors import SingleThreadedExecutor
from rclpy.parameter import Parameter
from sensor_msgs.msg import Image

from metavlm_ros.cli import main as cli_main
from metavlm_ros.common import results as results_module
from metavlm_ros.common.errors import ParameterError, ResultsError
from metavlm_ros.common.results import read_identity, read_jsonl
from metavlm_ros.footage.frames import frame_digest, load_image
from metavlm_ros.method.encoding import Composition
from metavlm_ros.method.prediction import Prediction, VLMBackend
from metavlm_ros.method.relations import apply_composition
from metavlm_ros.method.search import Evaluation
from metavlm_ros.ros import tester_output
from metavlm_ros.ros.conversions import image_msg_to_rgb, rgb_to_image_msg
from metavlm_ros.ros.managed import bring_up
from metavlm_ros.ros.tester_node import TesterNode as MetaVLMTester  # not 'Test*': pytest would collect it
from metavlm_ros.ros.tester_node import main
from metavlm_ros.ros.tester_settings import (
    PARAMETERS,
    coerce_parameters,
    settings_from_parameters,
    violation_status,
)
from metavlm_ros.ros.visualisation import format_change, violation_image
from test.conftest import make_frame
from test.ros.helpers import CameraPublisher, TopicCollector, ros_context, wait_for

# Table 2 of the paper, written out here so the test does not trust the code it checks:
# relation id -> (nominal, max deviation).
TABLE2 = {
    'rotation': (0.0, 5.0),
    'scaling': (1.0, 0.3),
    'histogram_equalization': (1.0, 1.0),
    'downsampling': (1.0, 0.1),
    'shear': (0.0, 0.15),
    'translation': (0.0, 0.03),
}


class StatsBackend(VLMBackend):
    """A cheap confidence-type stand-in: black fraction, mean green, mean red, grey contrast."""

    kind = 'confidence'
    classes = ('animal', 'vegetation', 'object', 'trash')
    model_id = 'stats'
    name = 'stats'

    def __init__(self, gate: threading.Event | None = None):
        self.gate = gate
        self.entered = threading.Event()
        self.calls = 0
        self.shapes: list[tuple[int, ...]] = []

    def predict(self, frames):
        self.calls += 1
        self.shapes.extend(f.shape for f in frames)
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(20)
        out = []
        for frame in frames:
            f = frame.astype(np.float64) / 255.0
            out.append(
                Prediction(
                    'confidence',
                    {
                        'animal': float(np.mean(np.all(frame == 0, axis=2))),
                        'vegetation': float(f[..., 1].mean()),
                        'object': float(f[..., 0].mean()),
                        'trash': float(f.mean(axis=2).std()),
                    },
                )
            )
        return out


def params(**values):
    base = {
        'vlm_endpoint': 'inprocess',
        'population': 6,
        'evaluations': 18,
        'frame_period_s': 0.0,
        'transport_size': 0,
        'report_threshold': 0.01,
    }
    base.update(values)
    return [Parameter(k, value=v) for k, v in base.items()]


class Graph:
    """A tester (stand-in model), a test camera and collectors of its three output topics."""

    def __init__(self, context, tmp_path, backend=None, start=True, **values):
        self.backend = backend or StatsBackend()
        self.tester = MetaVLMTester(
            context=context,
            backend=self.backend,
            parameter_overrides=params(results_dir=str(tmp_path / 'results'), **values),
        )
        if start:
            bring_up(self.tester)
        compressed = values.get('image_transport') == 'compressed'
        self.camera = CameraPublisher(context, compressed=compressed)
        self.violations = TopicCollector(context, 'violations', DiagnosticArray, name='violations_sink')
        self.images = TopicCollector(context, 'violation_image', Image, name='images_sink')
        self.diagnostics = TopicCollector(context, '/diagnostics', DiagnosticArray, name='diagnostics_sink')
        self.nodes = [self.tester, self.camera, self.violations, self.images, self.diagnostics]
        self.executor = SingleThreadedExecutor(context=context)
        for node in self.nodes:
            self.executor.add_node(node)
        self.results = tmp_path / 'results'

    def wait(self, predicate, timeout=20.0, message=''):
        wait_for(predicate, timeout, self.executor, message)

    def close(self):
        self.executor.shutdown(timeout_sec=2)
        for node in self.nodes:
            node.destroy_node()


@pytest.fixture
def graph(tmp_path):
    made = []
    with ros_context() as context:

        def make(**kwargs):
            g = Graph(context, tmp_path, **kwargs)
            made.append(g)
            if kwargs.get('start', True):
                g.wait(lambda: g.camera.publisher.get_subscription_count() > 0, 5, 'the tester to subscribe')
            return g

        yield make
        for g in made:
            g.close()


def values_of(status: DiagnosticStatus) -> dict[str, str]:
    return {kv.key: kv.value for kv in status.values}


def test_violations_are_stored_then_published_with_their_fields(graph):
    g = graph(violation_pngs_per_search=1000)
    frame = make_frame(160, 120, seed=5)
    stamp = g.camera.publish(frame, 7_000_000_123)
    g.wait(lambda: g.tester.searches_done == 1, message='the search')

    records = read_jsonl(g.results / 'evaluations.jsonl')
    assert len(records) == 18
    assert all(r['source_stamp'] == stamp and r['image'] == 'camera@7000000123' for r in records)
    published = [r for r in records if r['violation']['0.01'] and not r['cached'] and r['order'] > 0]
    assert published, 'the stand-in model should see violations at Th=0.01'
    g.wait(lambda: len(g.violations.messages) == len(published), 5, 'every violation on the topic')

    stored = read_jsonl(g.results / 'violations.jsonl')
    assert [s['index'] for s in stored] == [r['index'] for r in published]
    source = records[0]['source']
    for msg, record, saved in zip(g.violations.messages, published, stored, strict=True):
        assert (msg.header.stamp.sec, msg.header.stamp.nanosec) == (7, 123)
        assert len(msg.status) == 1
        status = msg.status[0]
        kv = values_of(status)
        assert status.name == 'metavlm/violation'
        assert status.message == record['composition'] == kv['composition']
        assert int(kv['order']) == record['order']
        assert int(kv['source_stamp']) == stamp
        # f_trans from the published MR parameters and Table 2 (Eq. 1, docs/method.md §3).
        params_ = {k: float(v) for k, v in kv.items() if k in TABLE2}
        assert len(params_) == record['order']
        f_trans = sum(abs(v - TABLE2[k][0]) / TABLE2[k][1] for k, v in params_.items())
        assert float(kv['f_trans']) == pytest.approx(f_trans, abs=1e-9)
        # f_pred for confidences (Eq. 3) from the published source and follow-up values.
        f_pred = sum(abs(float(kv[f'followup/{c}']) - float(kv[f'source/{c}'])) for c in source)
        assert float(kv['f_pred']) == pytest.approx(f_pred, abs=1e-12)
        assert float(kv['f_pred']) == pytest.approx(record['f_pred'])
        assert {c: float(kv[f'source/{c}']) for c in source} == pytest.approx(source)
        severe = f_pred >= len(source) / 2
        assert status.level == (DiagnosticStatus.ERROR if severe else DiagnosticStatus.WARN)
        # The follow-up PNG is the composition applied to the source frame.
        png = cv2.imread(str(g.results / saved['frame']))
        assert png.shape == frame.shape
        assert kv['frame'] == saved['frame']


def test_violation_images_show_both_frames(graph):
    g = graph(violation_image_height=120)
    frame = make_frame(160, 120, seed=5)
    g.camera.publish(frame)
    g.wait(lambda: g.tester.searches_done == 1, message='the search')
    g.wait(lambda: len(g.images.messages) == len(g.violations.messages) > 0, 5, 'the violation images')
    picture = image_msg_to_rgb(g.images.messages[0])
    # Two 160-pixel panels and a 4-pixel gap; panels 120 high plus a title and one line per class.
    assert picture.shape[1] == 160 + 4 + 160
    assert picture.shape[0] > 120
    title_h = (picture.shape[0] - 120 - 4) // 5
    panel = picture[title_h : title_h + 120]
    # Below the caption, the left panel is the source frame, untouched.
    assert np.array_equal(panel[40:, :160], frame[40:])


class RecordingBackend(StatsBackend):
    """The stand-in model, keeping a copy of every frame it was sent."""

    def __init__(self):
        super().__init__()
        self.judged: list[np.ndarray] = []

    def predict(self, frames):
        self.judged.extend(np.array(f) for f in frames)
        return super().predict(frames)


@pytest.mark.parametrize('warp', ['fused', 'sequential'])
def test_a_published_violation_shows_and_saves_the_very_follow_up_that_was_judged(graph, warp):
    g = graph(backend=RecordingBackend(), violation_image_height=120, violation_pngs_per_search=1000)
    # The tester has no warp parameter: the search's own warp is set on its settings directly.
    g.tester.settings.search.warp = warp
    frame = make_frame(160, 120, seed=5)
    g.camera.publish(frame)
    g.wait(lambda: g.tester.searches_done == 1, message='the search')
    stored = read_jsonl(g.results / 'violations.jsonl')
    assert stored and all(r['frame'] for r in stored)
    g.wait(lambda: len(g.images.messages) == len(stored), 5, 'the violation images')
    judged = {f.tobytes() for f in g.backend.judged}
    rendered_otherwise = 0
    for record, msg in zip(stored, g.images.messages, strict=True):
        png = load_image(g.results / record['frame'])
        # The saved PNG holds the pixels the model judged for this evaluation ...
        assert png.tobytes() in judged
        assert StatsBackend().predict([png])[0].values == pytest.approx(record['followup'])
        # ... and so does the published image's follow-up half, below its caption.
        picture = image_msg_to_rgb(msg)
        title_h = (picture.shape[0] - 120 - 4) // 5
        half = picture[title_h : title_h + 120, 164:]
        assert np.array_equal(half[40:], png[40:])
        composition = Composition.from_parameters(record['parameters'])
        other = apply_composition(frame, composition, fuse=warp != 'fused')
        rendered_otherwise += not np.array_equal(other, png)
    # The other warp gives other pixels for some of them: rendering again with a fixed warp shows.
    assert rendered_otherwise > 0


def test_diagnostics_report_the_search(graph):
    g = graph()
    g.camera.publish(make_frame(96, 72, seed=1))
    g.wait(lambda: g.tester.searches_done == 1, message='the search')
    count = len(g.diagnostics.messages)
    g.wait(lambda: len(g.diagnostics.messages) > count, 3, 'a diagnostics message after the search')
    status = g.diagnostics.messages[-1].status[0]
    kv = values_of(status)
    assert status.level == DiagnosticStatus.OK
    assert status.name == 'metavlm_tester: search'
    assert kv['searches_done'] == '1'
    assert kv['evaluations'] == '18'
    assert kv['frames_received'] == '1'
    assert kv['frames_dropped'] == '0'
    assert kv['perception_answering'] == 'n/a'
    assert float(kv['evaluations_per_s']) > 0
    assert 0 <= float(kv['last_hypervolume']) <= 1
    violations = int(kv['violations'])
    assert float(kv['violation_rate']) == pytest.approx(violations / g.tester.judged, abs=1e-5)


def test_frames_arriving_during_a_search_are_dropped_and_counted(graph):
    gate = threading.Event()
    g = graph(backend=StatsBackend(gate))
    frames = [make_frame(64, 48, seed=i) for i in range(5)]
    g.camera.publish(frames[0])
    g.wait(lambda: g.backend.entered.is_set(), 10, 'the first search to reach the model')
    for frame in frames[1:]:
        g.camera.publish(frame)
    g.wait(lambda: g.tester.frames_received == 5, 5, 'the camera frames')
    # One search runs (blocked in the model), one frame waits in the slot, the three before it went.
    assert g.tester.busy
    assert g.tester.frames_dropped == 3
    assert g.tester.has_pending_frame
    assert g.tester.camera_callback_max_s < 0.05
    gate.set()
    g.wait(lambda: g.tester.searches_done == 2, 20, 'the kept frame to be searched')
    images = {r['image'] for r in read_jsonl(g.results / 'summary.jsonl')}
    assert images == {f'camera@{g.camera.stamps[0]}', f'camera@{g.camera.stamps[4]}'}


def test_compressed_camera_frames_are_searched(graph):
    g = graph(image_transport='compressed')
    frame = make_frame(64, 48, seed=2)
    g.camera.publish(frame)
    g.wait(lambda: g.tester.searches_done == 1, message='the search')
    record = read_jsonl(g.results / 'summary.jsonl')[0]
    expected = StatsBackend().predict([frame])[0].values  # PNG is lossless: same pixels, same answer
    assert record['source'] == pytest.approx(expected)


def test_run_time_changes_are_validated_with_a_reason(graph):
    g = graph()
    tester = g.tester
    refused = tester.set_parameters([Parameter('report_threshold', value=0.02)])[0]
    assert not refused.successful
    assert 'report_threshold 0.02 must be one of the thresholds 0.01, 0.03, 0.05' in refused.reason
    out_of_range = tester.set_parameters([Parameter('ranges.rotation', value=[-9.0, 5.0])])[0]
    assert not out_of_range.successful
    reason = 'ranges.rotation: MR1 rotation angle -9.0 is outside the allowed range [-5, 5]'
    assert out_of_range.reason == reason
    inverted = tester.set_parameters([Parameter('ranges.scaling', value=[1.2, 0.8])])[0]
    assert not inverted.successful and inverted.reason.startswith('ranges.scaling: ')
    too_small = tester.set_parameters([Parameter('violation_image_height', value=8)])[0]
    assert not too_small.successful and 'violation_image_height' in too_small.reason
    assert tester.settings.violation_image_height == 360  # a refused value never reaches the settings
    fixed = tester.set_parameters([Parameter('vlm_endpoint', value='ros')])[0]
    assert not fixed.successful
    assert tester.settings.search.population == 6
    accepted = tester.set_parameters(
        [Parameter('population', value=8), Parameter('relations', value=['shear'])]
    )
    assert all(r.successful for r in accepted)
    assert tester.settings.search.population == 8
    assert tester.settings.search.space.enabled_ids == ('shear',)
    underwater = tester.set_parameters([Parameter('relations', value=['paper', 'turbidity', 'marine_snow'])])
    assert underwater[0].successful
    assert tester.settings.search.space.enabled_ids[6:] == ('turbidity', 'marine_snow')
    unknown = tester.set_parameters([Parameter('relations', value=['fog'])])[0]
    assert not unknown.successful and unknown.reason.startswith("relations: unknown relation 'fog'")
    assert '\n' not in unknown.reason


def test_the_angle_range_parameter_fixes_or_frees_the_blur_direction_of_the_searches(graph):
    g = graph(relations=['motion_blur'], **{'ranges.motion_blur_angle': [90.0, 90.0]})
    assert g.tester.settings.search.space.extra_bounds()[0].tolist() == [90.0]
    g.camera.publish(make_frame(160, 120, seed=5))
    g.wait(lambda: g.tester.searches_done == 1, message='the search')
    records = read_jsonl(g.results / 'evaluations.jsonl')
    blurred = [r['parameters'] for r in records if r['order'] > 0]
    assert blurred and {p['motion_blur_angle'] for p in blurred} == {90.0}
    assert read_identity(g.results)['settings']['relations']['extras'] == {'motion_blur_angle': [90.0, 90.0]}
    # Out of range: one line naming the parameter; another range: another identity, refused here.
    wrong = g.tester.set_parameters([Parameter('ranges.motion_blur_angle', value=[-95.0, 0.0])])[0]
    assert not wrong.successful
    assert wrong.reason == (
        'ranges.motion_blur_angle: MR10 motion_blur angle -95.0 is outside the allowed range [-90, 90]'
    )
    free = g.tester.set_parameters([Parameter('ranges.motion_blur_angle', value=[-90.0, 90.0])])[0]
    assert (
        not free.successful
        and 'settings.relations.extras.motion_blur_angle: [90.0, 90.0] there' in free.reason
    )
    elsewhere = [
        Parameter('results_dir', value=str(g.results) + '-free'),
        Parameter('ranges.motion_blur_angle', value=[-90.0, 90.0]),
    ]
    assert g.tester.set_parameters_atomically(elsewhere).successful
    assert g.tester.settings.search.space.extra_bounds()[1].tolist() == [90.0]


def test_a_new_transport_size_applies_to_the_next_search(graph):
    g = graph(transport_size=64)
    g.camera.publish(make_frame(160, 120, seed=1))
    g.wait(lambda: g.tester.searches_done == 1, message='the first search')
    assert set(g.backend.shapes) == {(48, 64, 3)}
    # Other searches go to another results directory: one directory holds searches of one identity.
    change = [Parameter('transport_size', value=40), Parameter('results_dir', value=str(g.results) + '-40')]
    assert g.tester.set_parameters_atomically(change).successful
    g.backend.shapes.clear()
    g.camera.publish(make_frame(160, 120, seed=2))
    g.wait(lambda: g.tester.searches_done == 2, message='the second search')
    # 160x120 -> longer side 40: 40x30, source and follow-ups alike.
    assert set(g.backend.shapes) == {(30, 40, 3)}
    assert len(read_jsonl(Path(str(g.results) + '-40') / 'summary.jsonl')) == 1


def test_the_results_directory_records_the_identity_of_its_searches(graph):
    g = graph()
    g.camera.publish(make_frame(96, 72, seed=1))
    g.wait(lambda: g.tester.searches_done == 1, message='the search')
    identity = read_identity(g.results)
    assert identity['settings']['population'] == 6 and identity['settings']['evaluations'] == 18
    assert identity['settings']['relations']['enabled'] == [True] * 6
    assert identity['source'] == {
        'endpoint': 'inprocess',
        'transport_size': 0,
        'image_transport': 'raw',
        'report_threshold': 0.01,
    }
    # A model handed over ready-made is known by what it says of itself.
    assert identity['model'] == {
        'backend': 'stats',
        'model': 'stats',
        'weights_sha256': None,
        'options': {'classes': list(StatsBackend.classes)},
    }
    # Each record names the pixels its search searched.
    digest = frame_digest(make_frame(96, 72, seed=1))
    assert {r['frame_sha256'] for r in read_jsonl(g.results / 'evaluations.jsonl')} == {digest}
    assert read_jsonl(g.results / 'summary.jsonl')[0]['frame_sha256'] == digest
    # A run-time change that would make the next searches another search is refused, naming it;
    # together with a new results_dir it is taken.
    refused = g.tester.set_parameters([Parameter('population', value=8)])[0]
    assert not refused.successful
    assert refused.reason.startswith(f'parameter results_dir: {g.results} holds searches of another identity')
    assert 'settings.population: 6 there, 8 here' in refused.reason
    assert g.tester.settings.search.population == 6
    other = str(g.results) + '-p8'
    assert g.tester.set_parameters([Parameter('results_dir', value=other)])[0].successful
    assert g.tester.set_parameters([Parameter('population', value=8)])[0].successful
    # Changes outside the identity stay free.
    assert g.tester.set_parameters([Parameter('frame_period_s', value=0.5)])[0].successful


def test_a_restart_into_results_of_another_search_is_refused_naming_what_differs(graph, tmp_path):
    g = graph()
    g.camera.publish(make_frame(96, 72, seed=1))
    g.wait(lambda: g.tester.searches_done == 1, message='the search')
    before = (g.results / 'evaluations.jsonl').read_bytes()
    g.close()
    with ros_context() as context:
        tester = MetaVLMTester(
            context=context,
            backend=StatsBackend(),
            parameter_overrides=params(results_dir=str(g.results), population=4, seed=3),
        )
        try:
            with pytest.raises(ResultsError) as refused:
                bring_up(tester)
        finally:
            tester.destroy_node()
    message = str(refused.value)
    assert '\n' not in message
    assert 'settings.population: 6 there, 4 here' in message and 'settings.seed: 0 there, 3 here' in message
    assert (g.results / 'evaluations.jsonl').read_bytes() == before
    # Results without an identity record (an older tester's) cannot be continued either.
    (g.results / 'search.json').unlink()
    with ros_context() as context:
        tester = MetaVLMTester(
            context=context, backend=StatsBackend(), parameter_overrides=params(results_dir=str(g.results))
        )
        try:
            with pytest.raises(ResultsError, match='holds results without an identity record'):
                bring_up(tester)
        finally:
            tester.destroy_node()
    assert (g.results / 'evaluations.jsonl').read_bytes() == before


def test_a_results_disk_below_its_reserve_pauses_searches_until_the_reserve_is_lowered(graph):
    # No disk has a petabyte free: the reserve is not met, so the frame must not be searched.
    g = graph(min_free_disk_mb=1_000_000_000)
    g.camera.publish(make_frame(96, 72, seed=1))
    g.wait(lambda: g.tester.searches_paused_disk == 1, message='the paused search')
    assert g.tester.searches_done == 0
    assert g.backend.calls == 0
    assert not (g.results / 'evaluations.jsonl').exists()
    count = len(g.diagnostics.messages)
    g.wait(lambda: len(g.diagnostics.messages) > count, 3, 'a diagnostics message')
    status = g.diagnostics.messages[-1].status[0]
    kv = values_of(status)
    assert status.level == DiagnosticStatus.WARN
    assert status.message.startswith('results disk nearly full')
    assert kv['searches_paused_disk'] == '1'
    free_mb = shutil.disk_usage(g.results.parent).free / 2**20
    assert float(kv['disk_free_mb']) == pytest.approx(free_mb, rel=0.05)

    assert g.tester.set_parameters([Parameter('min_free_disk_mb', value=0)])[0].successful
    g.camera.publish(make_frame(96, 72, seed=2))
    g.wait(lambda: g.tester.searches_done == 1, message='the search once the reserve is off')
    assert len(read_jsonl(g.results / 'evaluations.jsonl')) == 18
    count = len(g.diagnostics.messages)
    g.wait(lambda: len(g.diagnostics.messages) > count, 3, 'a diagnostics message')
    assert g.diagnostics.messages[-1].status[0].level == DiagnosticStatus.OK


def test_a_disk_filling_during_a_search_stops_it_and_keeps_records_without_pngs(graph, monkeypatch):
    backend = StatsBackend()
    reserve_mb = 100

    def free_bytes(_path):
        # Plenty until the model has answered the source frame and two generations, then 1 MiB.
        return (10_000 if backend.calls < 3 else 1) * 2**20

    monkeypatch.setattr(tester_output, 'free_disk_bytes', free_bytes)
    monkeypatch.setattr(results_module, 'free_disk_bytes', free_bytes)
    g = graph(
        backend=backend,
        evaluations=60,
        min_free_disk_mb=reserve_mb,
        violation_pngs_per_search=1000,
        pareto_pngs=-1,
    )
    g.camera.publish(make_frame(160, 120, seed=5))
    g.wait(lambda: g.tester.searches_done == 1, message='the search')
    assert g.tester.searches_stopped == 1
    assert g.tester.state == 'search stopped: the results disk fell below min_free_disk_mb'
    records = read_jsonl(g.results / 'evaluations.jsonl')
    assert 6 <= len(records) < 60  # records are still written, the search ends early
    assert len(read_jsonl(g.results / 'summary.jsonl')) == 1
    written = read_jsonl(g.results / 'violations.jsonl') + read_jsonl(g.results / 'pareto.jsonl')
    skipped = [r for r in written if r['frame'] is None]
    assert skipped, 'the last generation and the Pareto set come after the disk filled'
    # The first generation's violations were judged with room on the disk, the later ones without.
    violations = read_jsonl(g.results / 'violations.jsonl')
    assert all((r['frame'] is None) == (r['generation'] >= 1) for r in violations)
    assert any(r['frame'] is not None for r in violations)
    assert all(r['frame'] is None for r in read_jsonl(g.results / 'pareto.jsonl'))
    pngs = list((g.results / 'frames').glob('*.png')) if (g.results / 'frames').exists() else []
    assert len(pngs) == len(written) - len(skipped)
    assert values_of(g.tester.diagnostics())['frames_not_saved'] == str(len(skipped))


def test_past_results_max_mb_no_png_is_written_records_go_on_and_diagnostics_say_so(graph):
    # Noise does not compress: its source frame alone (768 px at the auto working size) is past 1 MiB.
    g = graph(results_max_mb=1, pareto_pngs=-1, violation_pngs_per_search=1000)
    noise = np.random.default_rng(3).integers(0, 256, (576, 768, 3), dtype=np.uint8)
    g.camera.publish(noise, 1_000_000_000)
    g.wait(lambda: g.tester.searches_done == 1, message='the search')
    assert len(read_jsonl(g.results / 'evaluations.jsonl')) == 18
    violations = read_jsonl(g.results / 'violations.jsonl')
    assert violations and all(r['frame'] is None for r in violations)
    assert all(r['frame'] is None for r in read_jsonl(g.results / 'pareto.jsonl'))
    (summary,) = read_jsonl(g.results / 'summary.jsonl')
    assert (g.results / summary['source_frame']).is_file() and not (g.results / 'frames').exists()
    values = values_of(status := g.tester.diagnostics())
    assert status.level == DiagnosticStatus.WARN and 'results_max_mb reached' in status.message
    assert float(values['results_hours_left']) == 0.0 and int(values['frames_over_budget']) > 0
    on_disk = sum(p.stat().st_size for p in g.results.rglob('*') if p.is_file())
    # Every byte written is counted (diagnostics show six significant digits).
    assert float(values['results_mb']) == pytest.approx(on_disk / 1e6, rel=1e-5)


def test_a_testers_follow_ups_render_again_byte_for_byte(graph, tmp_path):
    # The tester's directory is the layout of `metavlm run` and of each model of `metavlm demo`.
    g = graph(pareto_pngs=-1, violation_pngs_per_search=1000)
    g.camera.publish(make_frame(160, 120, seed=5), 1_000_000_000)
    g.wait(lambda: g.tester.searches_done == 1, message='the search')
    out = tmp_path / 'again'
    assert cli_main(['render', str(g.results), 'pareto', '--out', str(out)]) == 0
    pareto = read_jsonl(g.results / 'pareto.jsonl')
    assert pareto and all(p['frame'] for p in pareto)
    for p in pareto:
        assert (out / f'camera_1000000000_nsga2_s0_e{p["index"]:05d}.png').read_bytes() == (
            g.results / p['frame']
        ).read_bytes()
    # The violations' own PNGs are follow-ups of evaluations too.
    violations = [r for r in read_jsonl(g.results / 'violations.jsonl') if r['frame']]
    indices = [str(r['index']) for r in violations]
    assert cli_main(['render', str(g.results), *indices, '--out', str(out)]) == 0
    for r in violations:
        rendered = out / f'camera_1000000000_nsga2_s0_e{r["index"]:05d}.png'
        assert rendered.read_bytes() == (g.results / r['frame']).read_bytes()


def test_violation_pngs_are_bounded_per_search_and_the_rest_reported(graph):
    # A model that breaks on everything (the stand-in at Th 0.01) must not write a PNG per evaluation:
    # two per search for the published violations, plus the Pareto set's own.
    g = graph(violation_pngs_per_search=2, pareto_pngs=-1)
    for done, stamp in enumerate((1_000_000_000, 9_000_000_000), start=1):
        g.camera.publish(make_frame(160, 120, seed=5), stamp)
        g.wait(lambda done=done: g.tester.searches_done == done, message='a search')
    violations = read_jsonl(g.results / 'violations.jsonl')
    pareto = read_jsonl(g.results / 'pareto.jsonl')
    assert len(violations) > 4, 'the stand-in model should give more violations than the cap'
    for image in {r['image'] for r in violations}:
        saved = [r for r in violations if r['image'] == image and r['frame'] is not None]
        assert len(saved) == 2, image
    skipped = [r for r in violations if r['frame'] is None]
    assert values_of(g.tester.diagnostics())['violation_pngs_skipped'] == str(len(skipped))
    pngs = {p.name for p in (g.results / 'frames').glob('*.png')}
    expected = {Path(r['frame']).name for r in violations + pareto if r['frame'] is not None}
    assert pngs == expected and all(r['frame'] is not None for r in pareto)


@pytest.mark.parametrize(
    ('name', 'value', 'words'),
    [
        ('population', 1, 'population'),
        ('relations', ['warp'], 'warp'),
        ('ranges.translation', [-0.05, 0.03], 'ranges.translation'),
        ('probe_timeout_s', 0.0, 'probe_timeout_s'),
        ('algorithm', 'hill', 'algorithm'),
    ],
)
def test_invalid_parameters_at_start_raise_a_parameter_error(tmp_path, name, value, words):
    with ros_context() as context:
        with pytest.raises(ParameterError, match=words):
            MetaVLMTester(
                context=context, backend=StatsBackend(), parameter_overrides=params(**{name: value})
            )


def test_main_exits_1_with_one_line_on_invalid_parameters(capsys):
    code = main(['--ros-args', '-p', 'population:=1', '-p', 'vlm_endpoint:=inprocess'])
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith('metavlm_tester: error: parameter population')
    code = main(['--ros-args', '-p', 'relations:=[rotation, fog]', '-p', 'vlm_endpoint:=inprocess'])
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("metavlm_tester: error: relations: unknown relation 'fog'"), err


def test_settings_combine_generations_population_and_ranges():
    settings = settings_from_parameters(
        {'population': 5, 'generations': 3, 'evaluations': 999, 'ranges.rotation': [-2.0, 1.0], 'seed': 4}
    )
    assert settings.search.evaluations == 15
    assert settings.search.seed == 4
    assert settings.search.space.low[0] == -2.0 and settings.search.space.high[0] == 1.0
    assert settings.endpoint == 'ros' and settings.transport_size == 384
    # working_size: -1 (the default) is auto, 0 the camera's resolution.
    assert settings.search.working_size == 'auto'
    assert settings_from_parameters({'working_size': 0}).search.working_size is None
    assert settings_from_parameters({'working_size': 512}).search.working_size == 512
    with pytest.raises(ParameterError, match='class_prompts: 1 prompts for 4 classes'):
        settings_from_parameters({'class_prompts': ['a fish']})
    heave = settings_from_parameters({'relations': ['motion_blur'], 'ranges.motion_blur_angle': [90.0, 90.0]})
    assert heave.search.space.extra_low[9] == heave.search.space.extra_high[9] == (90.0,)
    with pytest.raises(
        ParameterError, match=r'^ranges.motion_blur_angle must be \[low, high\], got \[1.0\]$'
    ):
        settings_from_parameters({'ranges.motion_blur_angle': [1.0]})


def test_coerce_turns_integers_into_floats_only_for_double_parameters():
    out = coerce_parameters({'probe_timeout_s': 5, 'ranges.scaling': [1, 1.3], 'population': 30, 'other': 1})
    assert out == {'probe_timeout_s': 5.0, 'ranges.scaling': [1.0, 1.3], 'population': 30, 'other': 1}
    assert isinstance(out['probe_timeout_s'], float) and isinstance(out['population'], int)
    assert {p.name for p in PARAMETERS} >= {'vlm_endpoint', 'transport_size', 'frame_period_s', 'results_dir'}


def test_violation_status_levels_and_values():
    source = Prediction('count', {'animal': 2.0, 'vegetation': 0.0, 'object': 1.0, 'trash': 0.0})
    followup = Prediction('count', {'animal': 0.0, 'vegetation': 1.0, 'object': 1.0, 'trash': 0.0})
    comp = Composition.from_parameters({'rotation': 2.5, 'translation': -0.03})

    def evaluation(f_pred):
        return Evaluation(0, 0, np.zeros(12), comp, 1.5, f_pred, followup, {'count': True}, {'count': 3.0})

    # Eq. 2: 2/3 + 1/2 = 1.1667 < 4/2: a warning; 2.0 reaches half the classes: an error.
    warn = violation_status(evaluation(2 / 3 + 1 / 2), source, 42)
    error = violation_status(evaluation(2.0), source, 42)
    assert warn.level == DiagnosticStatus.WARN and error.level == DiagnosticStatus.ERROR
    kv = values_of(warn)
    assert warn.message == '{1,6}'
    assert kv['composition'] == '{1,6}' and kv['order'] == '2'
    assert float(kv['rotation']) == 2.5 and float(kv['translation']) == -0.03
    assert float(kv['f_trans']) == 1.5
    assert (
        kv['source/animal'] == '2.0' and kv['followup/animal'] == '0.0' and kv['followup/vegetation'] == '1.0'
    )
    assert kv['source_stamp'] == '42'
    blur = Composition.from_parameters({'motion_blur': 0.008, 'motion_blur_angle': -35.0})
    status = violation_status(Evaluation(0, 0, np.zeros(3), blur, 0.8, 1.0, followup, {}, {}), source, 42)
    assert values_of(status)['motion_blur'] == '0.008' and values_of(status)['motion_blur_angle'] == '-35.0'


def test_violation_image_layout_and_labels():
    source = make_frame(80, 60, seed=1)
    followup = np.zeros((30, 40, 3), np.uint8)
    picture = violation_image(
        source, followup, '{2}', {'animal': 0.2, 'trash': 0.1}, {'animal': 0.25, 'trash': 0.1}, height=60
    )
    assert picture.dtype == np.uint8 and picture.ndim == 3
    assert picture.shape[1] == 80 + 4 + 80  # the follow-up is brought to the source's height
    assert format_change('animal', 0.2, 0.25, 'confidence') == 'animal 0.200 -> 0.250 (+0.050)'
    assert format_change('animal', 2, 0, 'count') == 'animal 2 -> 0 (-2)'


def _malformed(kind: str) -> Image:
    if kind == 'one_pixel':
        return rgb_to_image_msg(np.zeros((1, 1, 3), np.uint8), 5_000_000_000)
    if kind == 'one_row':
        return rgb_to_image_msg(np.zeros((1, 64, 3), np.uint8), 5_000_000_000)
    if kind == 'bad_encoding':
        msg = rgb_to_image_msg(make_frame(32, 24), 5_000_000_000)
        msg.encoding = 'yuv422_yuy2_x'
        return msg
    msg = rgb_to_image_msg(make_frame(32, 24), 5_000_000_000)  # bad_length
    msg.data = bytes(msg.data)[:-7]
    return msg


@pytest.mark.parametrize('kind', ['one_pixel', 'one_row', 'bad_encoding', 'bad_length'])
def test_unreadable_frames_are_counted_and_the_error_clears_after_a_good_search(graph, kind):
    g = graph()
    errors = []
    real_error = g.tester.get_logger().error

    def spy(text, *args, **kwargs):
        errors.append(text)
        return real_error(text, *args, **kwargs)

    g.tester.get_logger().error = spy
    g.camera.publish_msg(_malformed(kind))
    g.wait(lambda: g.tester.frames_unreadable == 1, 10, 'the frame to be counted as unreadable')
    assert g.tester.searches_done == 0
    assert not [e for e in errors if 'search failed' in e], errors
    count = len(g.diagnostics.messages)
    g.wait(lambda: len(g.diagnostics.messages) > count, 3, 'diagnostics after the unreadable frame')
    kv = values_of(g.diagnostics.messages[-1].status[0])
    assert kv['frames_unreadable'] == '1'
    assert kv['last_error'].startswith('camera frame unreadable')
    assert 0 <= float(kv['last_error_age_s']) < 5

    g.camera.publish(make_frame(64, 48, seed=3))
    g.wait(lambda: g.tester.searches_done == 1, message='a good search')
    count = len(g.diagnostics.messages)
    g.wait(lambda: len(g.diagnostics.messages) > count, 3, 'diagnostics after the good search')
    kv = values_of(g.diagnostics.messages[-1].status[0])
    assert kv['frames_unreadable'] == '1'
    assert kv['last_error'] == ''
    assert kv['last_error_age_s'] == 'nan'


def test_a_served_model_lost_mid_search_is_reported_and_searching_resumes_when_it_is_back(graph):
    from metavlm_ros.models.vlm import create_backend
    from test.models.served_server import ScriptedServer, chat_body

    fail_after: list[int | None] = [None]  # requests answered before the server goes away

    def chat(body):
        if fail_after[0] is not None and len(server.requests) > fail_after[0]:
            return 503, {'error': {'message': 'overloaded'}}, 0.0
        return 200, chat_body('Animals: 2 fish Vegetation: None Objects: None Trash: None'), 0.0

    with ScriptedServer(chat) as server:
        served = create_backend('openai', 'recorded', endpoint=server.endpoint, retries=1, max_new_tokens=8)
        g = graph(backend=served, population=4, evaluations=8)
        g.camera.publish(make_frame(64, 48, seed=1), 1_000_000_000)
        g.wait(lambda: g.tester.searches_done == 1, 30, 'a search through the server')
        assert g.tester.last_error == '' and g.tester.searches_stopped == 0
        fail_after[0] = len(server.requests) + 1  # the next source frame is answered, its follow-ups not
        g.camera.publish(make_frame(64, 48, seed=2), 2_000_000_000)
        g.wait(lambda: g.tester.searches_done == 2, 30, 'the search the server left')
        assert g.tester.searches_stopped == 1
        assert '503' in g.tester.last_error and server.endpoint.split('//')[1] in g.tester.last_error
        assert g.tester.state.startswith('search stopped: ')
        fail_after[0] = None  # the server is back
        g.camera.publish(make_frame(64, 48, seed=3), 3_000_000_000)
        g.wait(lambda: g.tester.searches_done == 3, 30, 'a search once the server is back')
        assert g.tester.last_error == '' and g.tester.searches_stopped == 1
    summaries = read_jsonl(g.results / 'summary.jsonl')
    assert [s['stopped'] for s in summaries] == [False, True, False]
