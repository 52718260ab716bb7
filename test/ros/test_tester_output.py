"""What the tester keeps and publishes of a search (ros/tester_output.py): records, violations, images."""

import json
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticStatus
from rclpy.parameter import Parameter
from sensor_msgs.msg import Image

from metavlm_ros.cli import main as cli_main
from metavlm_ros.common import results as results_module
from metavlm_ros.common.gzip_lines import iter_members
from metavlm_ros.common.results import read_jsonl, records_file
from metavlm_ros.footage.frames import load_image
from metavlm_ros.method.encoding import Composition
from metavlm_ros.method.relations import apply_composition
from metavlm_ros.ros import tester_output
from metavlm_ros.ros.conversions import image_msg_to_rgb, rgb_to_image_msg
from test.conftest import make_frame
from test.ros.tester_graph import StatsBackend, values_of

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


def test_a_generations_violations_are_one_gzip_member_on_disk_before_any_is_published(graph):
    g = graph(violation_pngs_per_search=1000)
    on_disk_when_published = []
    publish = g.tester.violations_pub.publish

    def checked(array):
        kv = values_of(array.status[0])
        stored = {(r['composition'], repr(r['f_pred'])) for r in read_jsonl(g.results / 'violations.jsonl')}
        on_disk_when_published.append((kv['composition'], kv['f_pred']) in stored)
        publish(array)

    g.tester.violations_pub.publish = checked
    g.camera.publish(make_frame(160, 120, seed=5))
    g.wait(lambda: g.tester.searches_done == 1, message='the search')
    stored = read_jsonl(g.results / 'violations.jsonl')
    assert stored and on_disk_when_published == [True] * len(stored)
    generations = {r['generation'] for r in stored}
    assert len(generations) < len(stored), 'some generation should publish several violations'
    members = [m for m in iter_members(records_file(g.results / 'violations.jsonl')) if m.data]
    assert [sorted({r['generation'] for r in map(json.loads, m.data.splitlines())}) for m in members] == [
        [generation] for generation in sorted(generations)
    ]


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


def test_compressed_camera_frames_are_searched(graph):
    g = graph(image_transport='compressed')
    frame = make_frame(64, 48, seed=2)
    g.camera.publish(frame)
    g.wait(lambda: g.tester.searches_done == 1, message='the search')
    record = read_jsonl(g.results / 'summary.jsonl')[0]
    expected = StatsBackend().predict([frame])[0].values  # PNG is lossless: same pixels, same answer
    assert record['source'] == pytest.approx(expected)


def test_a_results_disk_below_its_reserve_pauses_searches_until_the_reserve_is_lowered(graph):
    # No disk has a petabyte free: the reserve is not met, so the frame must not be searched.
    g = graph(min_free_disk_mb=1_000_000_000)
    g.camera.publish(make_frame(96, 72, seed=1))
    g.wait(lambda: g.tester.searches_paused_disk == 1, message='the paused search')
    assert g.tester.searches_done == 0
    assert g.backend.calls == 0
    assert not records_file(g.results / 'evaluations.jsonl').exists()
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
