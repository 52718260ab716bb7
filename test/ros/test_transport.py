"""The DDS transport of local runs: given to launched nodes and `metavlm run/replay/demo`; off on request."""

import importlib.util
import os
from pathlib import Path
from xml.etree import ElementTree

import pytest

from metavlm_ros.ros.transport import USER_VARIABLES, local_transport_env, shm_profile, use_transport

ROOT = Path(__file__).resolve().parents[2]
NS = {'dds': 'http://www.eprosima.com'}


@pytest.fixture
def clean_env(monkeypatch):
    for name in (*USER_VARIABLES, 'RMW_IMPLEMENTATION'):
        monkeypatch.delenv(name, raising=False)
    return os.environ


def test_the_shipped_profile_gives_shared_memory_room_for_1080p_frames():
    profile = shm_profile()
    assert profile == ROOT / 'config' / 'fastdds_shm.xml'
    tree = ElementTree.parse(profile)
    descriptors = list(tree.iterfind('.//dds:transport_descriptor', NS))
    assert [d.findtext('dds:type', '', NS) for d in descriptors] == ['SHM']
    # Room for a few raw 1080p rgb8 frames (6 MiB each) in flight from one writer.
    assert int(descriptors[0].findtext('dds:segment_size', '0', NS)) >= 4 * 1920 * 1080 * 3
    participant = tree.find('.//dds:participant', NS)
    assert participant.get('is_default_profile') == 'true'
    used = [t.text for t in participant.iterfind('.//dds:userTransports/dds:transport_id', NS)]
    assert used == [descriptors[0].findtext('dds:transport_id', '', NS)]


def test_local_runs_get_the_profile_unless_the_user_chose_or_turned_it_off(clean_env, monkeypatch):
    assert local_transport_env(clean_env) == {'FASTDDS_DEFAULT_PROFILES_FILE': str(shm_profile())}
    assert local_transport_env(clean_env, 'default') == {}
    with pytest.raises(ValueError, match='transport must be one of shm, default'):
        local_transport_env(clean_env, 'udp')
    for name, value in (
        ('FASTDDS_BUILTIN_TRANSPORTS', 'LARGE_DATA'),
        ('FASTDDS_DEFAULT_PROFILES_FILE', '/robot/dds.xml'),
        ('RMW_IMPLEMENTATION', 'rmw_cyclonedds_cpp'),
    ):
        assert local_transport_env({name: value}) == {}, name


def test_use_transport_sets_the_profile_for_its_block_only(clean_env):
    with use_transport('shm') as description:
        assert os.environ['FASTDDS_DEFAULT_PROFILES_FILE'] == str(shm_profile())
        assert 'shared memory' in description
    assert 'FASTDDS_DEFAULT_PROFILES_FILE' not in os.environ
    with use_transport('default') as description:
        assert 'FASTDDS_DEFAULT_PROFILES_FILE' not in os.environ
        assert description == 'DDS as configured: defaults'


def test_launched_nodes_get_the_transport_and_dds_transport_default_turns_it_off(clean_env):
    pytest.importorskip('launch_ros')
    from launch import LaunchContext

    spec = importlib.util.spec_from_file_location('metavlm_launch', ROOT / 'launch' / 'metavlm.launch.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    from launch.actions import DeclareLaunchArgument

    declared = [
        a for a in module.generate_launch_description().entities if isinstance(a, DeclareLaunchArgument)
    ]

    def envs(dds_transport):
        context = LaunchContext()

        def text(substitutions):
            return ''.join(part.perform(context) for part in substitutions)

        given = {
            'camera_topic': '/camera/image_raw',
            'params_file': str(ROOT / 'config' / 'metavlm.yaml'),  # not the installed share/ one
            'use_sim_time': 'false',
            'vlm_endpoint': 'ros',
            'dds_transport': dds_transport,
        }
        # The arguments this test sets, and every other one the launch file declares at its default
        # (as `ros2 launch` gives them).
        context.launch_configurations.update(given)
        for argument in declared:
            if argument.name not in given:
                context.launch_configurations[argument.name] = text(argument.default_value or [])

        from launch_ros.actions import Node

        nodes = [action for action in module._nodes(context) if isinstance(action, Node)]  # not the handlers
        return [{text(k): text(v) for k, v in node.additional_env or []} for node in nodes]

    assert envs('shm') == [{'FASTDDS_DEFAULT_PROFILES_FILE': str(shm_profile())}] * 2
    assert envs('default') == [{}, {}]


@pytest.mark.parametrize('command', ['run', 'replay', 'demo'])
def test_commands_take_dds_transport(command):
    from metavlm_ros.cli import build_parser

    parser = build_parser()
    extra = {'replay': ['x.mcap'], 'run': [], 'demo': []}[command]
    assert parser.parse_args([command, *extra]).dds_transport == 'shm'
    assert parser.parse_args([command, *extra, '--dds-transport', 'default']).dds_transport == 'default'
