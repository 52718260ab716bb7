"""The launch files: loaded where ROS 2 launch is installed, otherwise checked statically with ast."""

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
LAUNCH_DIR = ROOT / 'launch'
LAUNCH_FILES = sorted(LAUNCH_DIR.glob('*.launch.py'))
NODE_NAMES = {'perception_node': 'metavlm_perception', 'tester_node': 'metavlm_tester'}


def console_scripts() -> dict[str, str]:
    """name -> 'module:function' from setup.py's entry points (or the two nodes when it is absent)."""
    setup = ROOT / 'setup.py'
    if not setup.exists():
        return {
            'perception_node': 'metavlm_ros.ros.perception_node:main',
            'tester_node': 'metavlm_ros.ros.tester_node:main',
        }
    scripts = {}
    for node in ast.walk(ast.parse(setup.read_text())):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == 'console_scripts':
                    for item in ast.literal_eval(value):
                        name, _, target = (part.strip() for part in item.partition('='))
                        scripts[name] = target
    return scripts


def _call_name(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ''


class LaunchFile:
    """What a launch file declares, uses, starts and names, read with ast."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tree = ast.parse(path.read_text())
        self.constants = {}  # module-level NAME = <literal>
        for node in self.tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                try:
                    self.constants[node.targets[0].id] = ast.literal_eval(node.value)
                except ValueError:
                    pass
        self.calls = [node for node in ast.walk(self.tree) if isinstance(node, ast.Call)]
        self.declared: dict[str, ast.Call] = {}
        for call in self.calls:
            # A name that is not a literal is derived (the backend options' arguments, from the registry):
            # test_every_launch_argument_has_wrong_values_under_test loads the file to see those.
            if _call_name(call) == 'DeclareLaunchArgument' and isinstance(call.args[0], ast.Constant):
                self.declared[ast.literal_eval(call.args[0])] = call
        declaration_strings = {
            id(n) for call in self.declared.values() for n in ast.walk(call) if isinstance(n, ast.Constant)
        }
        # Every string literal outside the declarations: launch arguments are read by name through
        # LaunchConfiguration(...) or a helper, directly or from a tuple of names.
        every = [n for n in ast.walk(self.tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
        self.strings = {n.value for n in every if id(n) not in declaration_strings}
        self.all_strings = {n.value for n in every}

    def keyword(self, call: ast.Call, name: str):
        for kw in call.keywords:
            if kw.arg == name:
                if isinstance(kw.value, ast.Name):
                    return self.constants[kw.value.id]
                return ast.literal_eval(kw.value)
        return None

    def nodes(self) -> list[dict]:
        return [
            {k: self.keyword(call, k) for k in ('package', 'executable', 'name')}
            for call in self.calls
            if _call_name(call) in ('Node', 'LifecycleNode')
        ]

    def default(self, argument: str):
        call = self.declared[argument]
        for kw in call.keywords:
            if kw.arg == 'default_value':
                return ast.literal_eval(kw.value) if isinstance(kw.value, ast.Constant) else kw.value
        return None


@pytest.fixture(scope='module')
def launch_files() -> dict[str, LaunchFile]:
    return {path.name: LaunchFile(path) for path in LAUNCH_FILES}


def test_both_launch_files_exist(launch_files):
    assert set(launch_files) == {'metavlm.launch.py', 'replay.launch.py'}
    for launch_file in launch_files.values():
        names = {n.name for n in launch_file.tree.body if isinstance(n, ast.FunctionDef)}
        assert 'generate_launch_description' in names


def test_every_executable_is_a_console_entry_point(launch_files):
    scripts = console_scripts()
    nodes = launch_files['metavlm.launch.py'].nodes()
    assert sorted(n['executable'] for n in nodes) == ['perception_node', 'tester_node']
    for node in nodes:
        assert node['package'] == 'metavlm_ros'
        assert node['executable'] in scripts, f'{node["executable"]} is not a console script in setup.py'
        assert node['name'] == NODE_NAMES[node['executable']]
        module, _, function = scripts[node['executable']].partition(':')
        assert callable(getattr(importlib.import_module(module), function))


def test_every_parameter_file_and_included_launch_file_exists(launch_files):
    for launch_file in launch_files.values():
        for text in launch_file.all_strings:
            if text.endswith('.yaml'):
                path = ROOT / 'config' / text
                assert path.is_file(), f'{launch_file.path.name} names config/{text}, which does not exist'
                assert isinstance(yaml.safe_load(path.read_text()), dict)
            if text.endswith('.launch.py'):
                assert (LAUNCH_DIR / text).is_file()


def test_every_launch_argument_is_used_and_every_used_one_declared(launch_files):
    for launch_file in launch_files.values():
        unused = [name for name in launch_file.declared if name not in launch_file.strings]
        assert not unused, f'{launch_file.path.name}: arguments declared but never read: {unused}'
    main = launch_files['metavlm.launch.py']
    assert set(main.declared) == {
        'camera_topic',
        'backend',
        'model',
        'params_file',
        'vlm_endpoint',
        'foxglove_port',
        'foxglove_host',
        'use_sim_time',
        'dds_transport',
        'autostart',
    }
    replay = launch_files['replay.launch.py']
    forwarded = replay.constants['FORWARDED']
    # what replay.launch.py hands on must be declared by both files
    assert set(forwarded) <= set(main.declared) and set(forwarded) <= set(replay.declared)
    assert {'bag', 'rate', 'loop', 'qos_overrides', 'player'} <= set(replay.declared)


def test_nodes_are_remapped_to_the_camera_and_to_each_other(launch_files):
    main = launch_files['metavlm.launch.py']
    assert {'image', 'image/compressed', 'probe', 'probe/prediction'} <= main.strings
    assert main.constants['PROBE_TOPIC'].startswith('/')
    assert main.default('camera_topic') == '/camera/image_raw'


def test_replay_runs_ros2_bag_play_with_the_qos_override(launch_files):
    replay = launch_files['replay.launch.py']
    assert {'ros2', 'bag', 'play', '--qos-profile-overrides-path', '--clock'} <= replay.strings
    assert 'qos_override.yaml' in {
        c.value for c in ast.walk(replay.declared['qos_overrides']) if isinstance(c, ast.Constant)
    }


def test_qos_override_covers_the_default_camera_topic(launch_files):
    from metavlm_ros.ros.bag_player import load_qos_overrides

    profiles = load_qos_overrides(ROOT / 'config' / 'qos_override.yaml')
    camera = launch_files['metavlm.launch.py'].default('camera_topic')
    assert camera in profiles and camera + '/compressed' in profiles
    from rclpy.qos import DurabilityPolicy, ReliabilityPolicy

    assert profiles[camera].reliability == ReliabilityPolicy.RELIABLE
    assert profiles[camera].durability == DurabilityPolicy.VOLATILE


def test_launch_descriptions_load_where_launch_is_installed():
    pytest.importorskip('launch_ros')
    launch = pytest.importorskip('launch')
    for path in LAUNCH_FILES:
        spec = importlib.util.spec_from_file_location(path.stem.replace('.', '_'), path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        description = module.generate_launch_description()
        assert isinstance(description, launch.LaunchDescription)
        assert {a.name for a in description.get_launch_arguments()} >= {'camera_topic', 'use_sim_time'}


def _replay_process(bag: str, dds_transport: str = 'shm'):
    """The `ros2 bag play` process replay.launch.py starts for `bag:=...` (its other defaults)."""
    pytest.importorskip('launch_ros')
    from launch import LaunchContext

    spec = importlib.util.spec_from_file_location('replay_launch', LAUNCH_DIR / 'replay.launch.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    context = LaunchContext()
    context.launch_configurations.update(
        {
            'bag': bag,
            'qos_overrides': 'qos.yaml',
            'rate': '1.0',
            'loop': 'false',
            'use_sim_time': 'true',
            'dds_transport': dds_transport,
        }
    )
    (process,) = module._bag_play(context)

    def text(substitutions):
        return ''.join(part.perform(context) for part in substitutions)

    cmd = [text(word) for word in process.cmd]
    env = {text(key): text(value) for key, value in process.additional_env or []}
    return cmd, env


def _replay_command(bag: str) -> list[str]:
    return _replay_process(bag)[0]


def test_replay_gives_the_player_the_shared_memory_transport_unless_turned_off(monkeypatch):
    for name in (
        'FASTDDS_DEFAULT_PROFILES_FILE',
        'FASTRTPS_DEFAULT_PROFILES_FILE',
        'FASTDDS_BUILTIN_TRANSPORTS',
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv('RMW_IMPLEMENTATION', raising=False)
    _, env = _replay_process('dive.mcap')
    assert Path(env['FASTDDS_DEFAULT_PROFILES_FILE']).name == 'fastdds_shm.xml'
    assert Path(env['FASTDDS_DEFAULT_PROFILES_FILE']).is_file()
    assert _replay_process('dive.mcap', 'default')[1] == {}
    # A transport the user chose is theirs.
    monkeypatch.setenv('FASTDDS_BUILTIN_TRANSPORTS', 'LARGE_DATA')
    assert _replay_process('dive.mcap')[1] == {}


def test_replay_plays_the_bag_under_the_name_scenes_gave_it(tmp_path):
    from metavlm_ros.cli import main as metavlm

    small = ['--frames', '2', '--size', '32x24']
    assert metavlm(['scenes', '--out', str(tmp_path / 'dive.mcap'), *small]) == 0
    assert metavlm(['scenes', '--out', str(tmp_path / 'dive_bag'), *small]) == 0
    cmd = _replay_command(str(tmp_path / 'dive.mcap'))
    assert cmd[:4] == ['ros2', 'bag', 'play', str(tmp_path / 'dive.mcap')]
    assert cmd[cmd.index('--storage') + 1] == 'mcap'  # Humble's rosbag2 needs it for a lone file
    cmd = _replay_command(str(tmp_path / 'dive_bag'))
    assert cmd[3] == str(tmp_path / 'dive_bag') and '--storage' not in cmd
    # A bag directory an older `scenes --out old.mcap` wrote answers to old.mcap.
    from metavlm_ros.footage.bags import write_bag
    from metavlm_ros.footage.scenes import SceneGenerator

    write_bag(tmp_path / 'old', SceneGenerator(32, 24, 10, seed=1, frames=2), fps=10)
    assert _replay_command(str(tmp_path / 'old.mcap'))[3] == str(tmp_path / 'old')


def test_ros1_bags_and_videos_play_through_metavlm_replay(tmp_path, monkeypatch):
    # `ros2 bag play` reads neither: the package's own player is started for them, whatever `player` says.
    prefix = tmp_path / 'install'
    (prefix / 'share' / 'ament_index' / 'resource_index' / 'packages').mkdir(parents=True)
    (prefix / 'share' / 'ament_index' / 'resource_index' / 'packages' / 'metavlm_ros').touch()
    (prefix / 'share' / 'metavlm_ros').mkdir()
    monkeypatch.setenv('AMENT_PREFIX_PATH', str(prefix))
    for footage in ('dive.bag', 'dive.mp4', 'dive.MKV'):
        cmd = _replay_command(str(tmp_path / footage))
        assert cmd[:3] == [str(prefix / 'lib' / 'metavlm_ros' / 'metavlm'), 'replay', str(tmp_path / footage)]
        assert '--clock' in cmd and '--qos-profile-overrides-path' in cmd
    assert _replay_command(str(tmp_path / 'dive.mcap'))[:3] == ['ros2', 'bag', 'play']


def _load_launch_module(name: str):
    spec = importlib.util.spec_from_file_location(name.replace('.', '_'), LAUNCH_DIR / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _launch_context(**arguments):
    from launch import LaunchContext

    context = LaunchContext()
    context.launch_configurations.update(arguments)
    return context


# launch file -> argument -> wrong values. Arguments that one node checks (so the other keeps running)
# are tested through `ros2 launch` in test_launch_system.py: see NODE_CHECKED.
WRONG_ARGUMENTS = {
    'metavlm.launch.py': {
        'camera_topic': ['camera image', '', '/camera/', '1camera', 'cam-era'],
        'backend': ['gpt', 'CLIP'],
        'params_file': ['{missing}', '{list_yaml}', '{broken_yaml}', '{bad_block}'],
        'use_sim_time': ['maybe', ''],
        'autostart': ['on-demand'],
        'dds_transport': ['udp'],
        'foxglove_port': ['-1', '65536', 'eighty', '8765.0'],
    },
    'replay.launch.py': {
        'bag': ['{missing}'],
        'rate': ['0', '-1', 'fast', 'nan'],
        'loop': ['twice'],
        'player': ['vlc'],
        'qos_overrides': ['{missing}', '{list_yaml}', '{bad_qos}'],
        'use_sim_time': ['maybe'],
        'dds_transport': ['udp'],
    },
}
NODE_CHECKED = {
    'model': 'perception node (configure)',
    'vlm_endpoint': 'tester node',
    'foxglove_host': 'tester node',
}


def _option_arguments() -> dict[str, list[str]]:
    """metavlm.launch.py's argument per backend option: a value that is not of the option's type stops
    the launch; a text option's value is the nodes' to check (their parameter tests)."""
    from metavlm_ros.models.registry import all_options

    return {
        o.parameter_name: ['[1, 2'] if o.type in (list, dict) else ['many']
        for o in all_options().values()
        if o.type is not str
    }


def _text_option_arguments() -> set[str]:
    from metavlm_ros.models.registry import all_options

    return {o.parameter_name for o in all_options().values() if o.type is str}


def _every_argument(name: str) -> set[str]:
    return {a.name for a in _load_launch_module(name).generate_launch_description().get_launch_arguments()}


@pytest.mark.parametrize('launch_file', sorted(WRONG_ARGUMENTS))
def test_every_launch_argument_has_wrong_values_under_test(launch_file):
    pytest.importorskip('launch_ros')
    checked = set(WRONG_ARGUMENTS[launch_file]) | set(NODE_CHECKED)
    if launch_file == 'metavlm.launch.py':
        checked |= set(_option_arguments()) | _text_option_arguments()
    if launch_file == 'replay.launch.py':  # what it hands on to metavlm.launch.py is checked there
        checked |= set(WRONG_ARGUMENTS['metavlm.launch.py'])
    assert _every_argument(launch_file) == checked


LAUNCH_CASES = [
    (launch_file, argument, value)
    for launch_file, arguments in {
        **WRONG_ARGUMENTS,
        'metavlm.launch.py': {**WRONG_ARGUMENTS['metavlm.launch.py'], **_option_arguments()},
    }.items()
    for argument, values in arguments.items()
    for value in values
]


@pytest.mark.parametrize(
    ('launch_file', 'argument', 'value'), LAUNCH_CASES, ids=[f'{f}-{a}-{v!r}' for f, a, v in LAUNCH_CASES]
)
def test_a_wrong_launch_argument_stops_the_launch_with_one_line_naming_it(
    tmp_path, launch_file, argument, value
):
    pytest.importorskip('launch_ros')
    from metavlm_ros.footage.bags import write_bag
    from test.conftest import make_frame

    files = {
        'missing': tmp_path / 'nope.yaml',
        'list_yaml': tmp_path / 'list.yaml',
        'broken_yaml': tmp_path / 'broken.yaml',
        'bad_block': tmp_path / 'block.yaml',
        'bad_qos': tmp_path / 'qos.yaml',
    }
    files['list_yaml'].write_text('[1, 2]\n')
    files['broken_yaml'].write_text('metavlm_tester: {ros__parameters: [\n')
    files['bad_block'].write_text('metavlm_tester: 5\n')
    files['bad_qos'].write_text('/camera/image_raw:\n  reliability: sometimes\n')
    bag = write_bag(tmp_path / 'dive', [(make_frame(32, 24), None)], fps=5.0)
    good = {
        'camera_topic': '/camera/image_raw',
        'backend': '',
        'model': '',
        'params_file': str(ROOT / 'config' / 'metavlm.yaml'),
        'vlm_endpoint': 'ros',
        'foxglove_port': '',
        'foxglove_host': '',
        'use_sim_time': 'false',
        'dds_transport': 'shm',
        'autostart': 'true',
        'bag': str(bag),
        'rate': '1.0',
        'loop': 'false',
        'player': 'ros2',
        'qos_overrides': str(ROOT / 'config' / 'qos_override.yaml'),
    }
    module = _load_launch_module(launch_file)
    check = module._nodes if launch_file == 'metavlm.launch.py' else module._checked
    check(_launch_context(**good))  # the good values pass
    wrong = value.format(**{k: str(v) for k, v in files.items()})
    with pytest.raises(ValueError) as refused:
        check(_launch_context(**{**good, argument: wrong}))
    message = str(refused.value)
    assert message.startswith(f'launch argument {argument}: ') and '\n' not in message, message
