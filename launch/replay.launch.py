"""Replay a bag (ROS 2 or ROS 1) or a video into the perception and tester nodes, once they are active."""

import os
from pathlib import Path

from launch.actions import (
    DeclareLaunchArgument,
    ExecuteProcess,
    IncludeLaunchDescription,
    OpaqueFunction,
    RegisterEventHandler,
)
from launch.launch_description import LaunchDescription
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.event_handlers import OnStateTransition
from launch_ros.substitutions import FindPackagePrefix, FindPackageShare

PACKAGE = 'metavlm_ros'
# Arguments handed on to metavlm.launch.py unchanged.
FORWARDED = (
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
)
PLAYERS = ('ros2', 'metavlm')


def _bag_path(name: str) -> str:
    """The bag `name` refers to: itself, or the bag directory an older `metavlm scenes` wrote."""
    from metavlm_ros.common.errors import BagError
    from metavlm_ros.footage.bags import resolve_bag

    try:
        return str(resolve_bag(name))
    except BagError:
        return name  # the player says what is wrong with it


def _needs_own_player(footage: str) -> bool:
    """Whether the footage is a ROS 1 bag or a video, which only `metavlm replay` plays."""
    from metavlm_ros.footage.frames import is_video_path

    return Path(footage).suffix.lower() == '.bag' or is_video_path(footage)


def _flag(context, name: str) -> bool:
    from metavlm_ros.ros.launch_arguments import flag

    return flag(name, LaunchConfiguration(name).perform(context))


def _player_command(context) -> list:
    """`ros2 bag play` (or `metavlm replay`) with the camera QoS override, --clock for sim time."""

    def arg(name: str) -> str:
        return LaunchConfiguration(name).perform(context)

    from metavlm_ros.ros.launch_arguments import one_of, positive_number

    bag, rate = _bag_path(arg('bag')), arg('rate')
    player = one_of('player', LaunchConfiguration('player', default='ros2').perform(context), PLAYERS)
    positive_number('rate', rate)
    if _needs_own_player(bag):
        player = 'metavlm'  # `ros2 bag play` reads neither ROS 1 bags nor videos
    if player == 'ros2':
        cmd = ['ros2', 'bag', 'play', bag]
        storage = {'.mcap': 'mcap', '.db3': 'sqlite3'}.get(Path(bag).suffix.lower())
        if storage and Path(bag).is_file():
            cmd += ['--storage', storage]  # a lone storage file: Humble's rosbag2 does not guess it
    else:  # the package's own player: no rosbag2 needed
        metavlm = PathJoinSubstitution([FindPackagePrefix(PACKAGE), 'lib', PACKAGE, 'metavlm']).perform(
            context
        )
        cmd = [metavlm, 'replay', bag]
    cmd += ['--qos-profile-overrides-path', arg('qos_overrides'), '--rate', rate]
    if _flag(context, 'loop'):
        cmd.append('--loop')
    if _flag(context, 'use_sim_time'):
        cmd.append('--clock')
    return cmd


def _bag_play(context, *args, **kwargs):
    """The player process, with the project's transport: the writer's segment decides whether frames fit."""
    from metavlm_ros.ros.transport import local_transport_env

    try:
        env = local_transport_env(os.environ, LaunchConfiguration('dds_transport').perform(context))
    except ValueError as exc:
        raise ValueError(f'launch argument dds_transport: {exc}') from None
    return [ExecuteProcess(cmd=_player_command(context), output='screen', name='player', additional_env=env)]


def _checked(context, *args, **kwargs):
    """Check the player's arguments before any node starts (one line naming a wrong one)."""
    from metavlm_ros.common.errors import MetaVLMError
    from metavlm_ros.ros.bag_player import load_qos_overrides
    from metavlm_ros.ros.launch_arguments import LaunchArgumentError

    bag = LaunchConfiguration('bag').perform(context)
    if not os.path.exists(_bag_path(bag)):
        raise LaunchArgumentError('bag', f'no such bag or video {bag!r}')
    qos = LaunchConfiguration('qos_overrides').perform(context)
    if not os.path.isfile(qos):
        raise LaunchArgumentError('qos_overrides', f'no such file {qos!r}')
    try:
        load_qos_overrides(qos)
    except MetaVLMError as exc:
        raise LaunchArgumentError('qos_overrides', str(exc)) from None
    _bag_play(context)
    return []


def _start_player_when_ready() -> list:
    """Event handlers that start the player once the nodes that judge frames are active.

    The tester must be active, and with the `ros` endpoint the perception node too: frames played
    before then would be lost, and a short bag would be over before anything was searched. With
    autostart the launch's own activate answers say so (NodeActive); with autostart:=false the nodes'
    transition events do, when you activate them.
    """
    from launch.event_handler import EventHandler

    from metavlm_ros.ros.launch_lifecycle import NodeActive

    active: set[str] = set()
    started = []

    def on_active(context, *args, **kwargs):
        event = context.locals.event
        name = event.node_name if isinstance(event, NodeActive) else event.action.node_name
        active.add(name.lstrip('/'))
        wanted = {'metavlm_tester'}
        if LaunchConfiguration('vlm_endpoint').perform(context) != 'inprocess':
            wanted.add('metavlm_perception')
        if started or not wanted <= active:
            return []
        started.append(True)
        return _bag_play(context)

    return [
        RegisterEventHandler(
            OnStateTransition(
                matcher=lambda event: getattr(event, 'goal_state', None) == 'active',
                entities=[OpaqueFunction(function=on_active)],
            )
        ),
        RegisterEventHandler(
            EventHandler(
                matcher=lambda event: isinstance(event, NodeActive),
                entities=[OpaqueFunction(function=on_active)],
            )
        ),
    ]


def generate_launch_description() -> LaunchDescription:
    """Arguments: bag, rate, loop, qos_overrides, player, and those of metavlm.launch.py."""
    share = FindPackageShare(PACKAGE)
    nodes = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(PathJoinSubstitution([share, 'launch', 'metavlm.launch.py'])),
        launch_arguments={name: LaunchConfiguration(name) for name in FORWARDED}.items(),
    )
    return LaunchDescription(
        [
            DeclareLaunchArgument(
                'bag',
                description='footage to replay: a bag (directory, .mcap, .db3; ROS 1 .bag) or a video',
            ),
            DeclareLaunchArgument('rate', default_value='1.0', description='playback speed factor'),
            DeclareLaunchArgument('loop', default_value='false', description='replay the bag until stopped'),
            DeclareLaunchArgument(
                'qos_overrides',
                default_value=PathJoinSubstitution([share, 'config', 'qos_override.yaml']),
                description='QoS profile overrides of the player, keyed by topic',
            ),
            DeclareLaunchArgument(
                'player',
                default_value='ros2',
                description='ros2 (ros2 bag play) | metavlm (metavlm replay: no rosbag2 needed; '
                'always for ROS 1 bags and videos)',
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
                'foxglove_port',
                default_value='',
                description="watch the dive's searches live in Foxglove on this port ('' = params file: off)",
            ),
            DeclareLaunchArgument(
                'foxglove_host',
                default_value='',
                description="address of the tester's Foxglove server ('' = params file: 127.0.0.1)",
            ),
            DeclareLaunchArgument(
                'use_sim_time', default_value='true', description='nodes follow the bag clock (/clock)'
            ),
            DeclareLaunchArgument(
                'dds_transport',
                default_value='shm',
                description='shm: shared memory for raw full-size frames (player and nodes) | default',
            ),
            DeclareLaunchArgument(
                'autostart',
                default_value='true',
                description='bring both nodes to active; false: the bag plays once you activate them',
            ),
            OpaqueFunction(function=_checked),
            *_start_player_when_ready(),
            nodes,
        ]
    )
