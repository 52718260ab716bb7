"""Replay a bag with `ros2 bag play` into the metavlm_ros perception and tester nodes."""

import os
from pathlib import Path

from launch.actions import DeclareLaunchArgument, ExecuteProcess, IncludeLaunchDescription, OpaqueFunction
from launch.launch_description import LaunchDescription
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.substitutions import FindPackageShare

PACKAGE = 'metavlm_ros'
# Arguments handed on to metavlm.launch.py unchanged.
FORWARDED = (
    'camera_topic',
    'backend',
    'model',
    'params_file',
    'vlm_endpoint',
    'use_sim_time',
    'dds_transport',
)


def _bag_path(name: str) -> str:
    """The bag `name` refers to: itself, or the bag directory an older `metavlm scenes` wrote."""
    from metavlm_ros.core.bags import resolve_bag
    from metavlm_ros.core.errors import BagError

    try:
        return str(resolve_bag(name))
    except BagError:
        return name  # ros2 bag play says what is wrong with it


def _bag_play(context, *args, **kwargs):
    """`ros2 bag play` with the camera QoS override, and --clock when the nodes use sim time."""

    def arg(name: str) -> str:
        return LaunchConfiguration(name).perform(context)

    bag = _bag_path(arg('bag'))
    cmd = ['ros2', 'bag', 'play', bag, '--qos-profile-overrides-path', arg('qos_overrides')]
    storage = {'.mcap': 'mcap', '.db3': 'sqlite3'}.get(Path(bag).suffix.lower())
    if storage and Path(bag).is_file():
        cmd += ['--storage', storage]  # a lone storage file: Humble's rosbag2 does not guess it
    cmd += ['--rate', arg('rate')]
    if arg('loop').lower() in ('true', '1', 'yes'):
        cmd.append('--loop')
    if arg('use_sim_time').lower() in ('true', '1', 'yes'):
        cmd.append('--clock')
    from metavlm_ros.ros.transport import local_transport_env

    # The player writes the frames: its transport decides whether full-size frames fit.
    env = local_transport_env(os.environ, arg('dds_transport'))
    return [ExecuteProcess(cmd=cmd, output='screen', additional_env=env)]


def generate_launch_description() -> LaunchDescription:
    """Arguments: bag, rate, loop, qos_overrides, and those of metavlm.launch.py."""
    share = FindPackageShare(PACKAGE)
    nodes = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(PathJoinSubstitution([share, 'launch', 'metavlm.launch.py'])),
        launch_arguments={name: LaunchConfiguration(name) for name in FORWARDED}.items(),
    )
    return LaunchDescription(
        [
            DeclareLaunchArgument('bag', description='bag to replay (directory, .mcap or .db3)'),
            DeclareLaunchArgument('rate', default_value='1.0', description='playback speed factor'),
            DeclareLaunchArgument('loop', default_value='false', description='replay the bag until stopped'),
            DeclareLaunchArgument(
                'qos_overrides',
                default_value=PathJoinSubstitution([share, 'config', 'qos_override.yaml']),
                description='QoS profile overrides of ros2 bag play, keyed by topic',
            ),
            DeclareLaunchArgument(
                'camera_topic', default_value='/camera/image_raw', description='camera image topic in the bag'
            ),
            DeclareLaunchArgument('backend', default_value='', description="VLM family ('' = params file)"),
            DeclareLaunchArgument('model', default_value='', description="model ('' = params file)"),
            DeclareLaunchArgument(
                'params_file',
                default_value=PathJoinSubstitution([share, 'config', 'metavlm.yaml']),
                description='parameter file of both nodes',
            ),
            DeclareLaunchArgument('vlm_endpoint', default_value='ros', description='ros | inprocess'),
            DeclareLaunchArgument(
                'use_sim_time', default_value='true', description='nodes follow the bag clock (/clock)'
            ),
            DeclareLaunchArgument(
                'dds_transport',
                default_value='shm',
                description='shm: shared memory for raw full-size frames (player and nodes) | default',
            ),
            nodes,
            OpaqueFunction(function=_bag_play),
        ]
    )
