"""Launch the metavlm_ros perception and tester nodes (managed nodes) on a camera topic."""

import os

from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.launch_description import LaunchDescription
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import LifecycleNode
from launch_ros.substitutions import FindPackageShare

PACKAGE = 'metavlm_ros'
# The tester's probes and the perception node's answers meet here (both nodes are remapped to it),
# away from any other node's `probe` topic on the robot.
PROBE_TOPIC = '/metavlm/probe'
PERCEPTION = 'metavlm_perception'
TESTER = 'metavlm_tester'
FLAG_DEFAULTS = {'use_sim_time': 'false', 'autostart': 'true'}


def flag(context, name: str) -> bool:
    """A true/false launch argument; anything else stops the launch with one line naming it."""
    from metavlm_ros.ros.launch_arguments import flag as checked_flag

    return checked_flag(name, LaunchConfiguration(name, default=FLAG_DEFAULTS[name]).perform(context))


def _nodes(context, *args, **kwargs):
    """Build both nodes once the launch arguments are known (and checked)."""

    def arg(name: str) -> str:
        return LaunchConfiguration(name).perform(context)

    from metavlm_ros.models.registry import BACKENDS, all_options
    from metavlm_ros.ros.launch_arguments import (
        one_of,
        parameter_value,
        params_file,
        port_number,
        topic_name,
    )

    # What both nodes would refuse is checked here, in one line naming the argument; what one node
    # refuses (vlm_endpoint, model) that node says, and the other keeps running.
    camera_topic = topic_name('camera_topic', arg('camera_topic'))
    topic_name('camera_topic', camera_topic + '/compressed')
    parameters = params_file('params_file', arg('params_file'), (PERCEPTION, TESTER))
    use_sim_time = flag(context, 'use_sim_time')
    autostart = flag(context, 'autostart')
    one_of('backend', arg('backend'), BACKENDS, empty=True)
    foxglove_port = port_number('foxglove_port', arg('foxglove_port'), empty=True)
    # Empty arguments leave the parameter file's value in force; the nodes check the values given.
    model_overrides = {name: arg(name) for name in ('backend', 'model') if arg(name)}
    for option in all_options().values():
        given = LaunchConfiguration(option.parameter_name, default='').perform(context)
        if given:
            model_overrides[option.parameter_name] = parameter_value(
                option.parameter_name, given, option.type
            )
    camera_remaps = [('image', camera_topic), ('image/compressed', camera_topic + '/compressed')]
    probe_remaps = [('probe', PROBE_TOPIC), ('probe/prediction', PROBE_TOPIC + '/prediction')]
    from metavlm_ros.ros.transport import local_transport_env

    # Shared memory with room for raw full-size camera frames (dds_transport:=default: DDS as installed).
    try:
        transport_env = local_transport_env(os.environ, arg('dds_transport'))
    except ValueError as exc:
        raise ValueError(f'launch argument dds_transport: {exc}') from None

    perception = LifecycleNode(
        package=PACKAGE,
        executable='perception_node',
        name=PERCEPTION,
        namespace='',
        output='screen',
        parameters=[parameters, {'use_sim_time': use_sim_time, **model_overrides}],
        remappings=camera_remaps + probe_remaps,
        additional_env=transport_env,
    )
    tester_overrides = {'use_sim_time': use_sim_time, **model_overrides}
    if arg('vlm_endpoint'):
        tester_overrides['vlm_endpoint'] = arg('vlm_endpoint')
    if foxglove_port:
        tester_overrides['foxglove_port'] = int(foxglove_port)
    if arg('foxglove_host'):  # an address the tester cannot bind refuses its configure, in one line
        tester_overrides['foxglove_host'] = arg('foxglove_host')
    tester = LifecycleNode(
        package=PACKAGE,
        executable='tester_node',
        name=TESTER,
        namespace='',
        output='screen',
        parameters=[parameters, tester_overrides],
        remappings=camera_remaps + probe_remaps,
        additional_env=transport_env,
    )
    if not autostart:
        return [perception, tester]
    # Not launch_ros's ChangeState events: their requests outlive a node that died and end in a
    # traceback at Ctrl-C (metavlm_ros/ros/launch_lifecycle.py says where and why). The handlers come
    # first, so that they are in place when the processes start.
    from metavlm_ros.ros.launch_lifecycle import Transitions

    transitions = Transitions()
    return [
        *transitions.bring_to_active(perception, PERCEPTION),
        *transitions.bring_to_active(tester, TESTER),
        transitions.closer(),
        perception,
        tester,
    ]


def _model_arguments() -> list:
    """One argument per option of the backends (models/registry.py): `endpoint:=...`, `kind:=...`;
    '' leaves the parameter file's value in force."""
    from metavlm_ros.models.registry import all_options, options_for

    return [
        DeclareLaunchArgument(
            option.parameter_name,
            default_value='',
            description=f"{option.help} [{', '.join(options_for(option.name))}] ('' = params file)",
        )
        for option in all_options().values()
    ]


def generate_launch_description() -> LaunchDescription:
    """Arguments: camera_topic, backend, model, params_file, vlm_endpoint, foxglove_port, foxglove_host,
    use_sim_time, dds_transport, autostart, and one per backend option (endpoint, kind, max_batch, ...)."""
    from metavlm_ros.models.registry import BACKENDS

    default_params = PathJoinSubstitution([FindPackageShare(PACKAGE), 'config', 'metavlm.yaml'])
    return LaunchDescription(
        [
            DeclareLaunchArgument(
                'camera_topic', default_value='/camera/image_raw', description='camera image topic'
            ),
            DeclareLaunchArgument(
                'backend', default_value='', description=f"{' | '.join(BACKENDS)} ('' = params file)"
            ),
            DeclareLaunchArgument(
                'model', default_value='', description="model id or directory ('' = params file)"
            ),
            DeclareLaunchArgument(
                'params_file', default_value=default_params, description='parameter file of both nodes'
            ),
            DeclareLaunchArgument(
                'vlm_endpoint', default_value='ros', description="ros (perception node) | inprocess | ''"
            ),
            DeclareLaunchArgument(
                'foxglove_port',
                default_value='',
                description="serve the tester's searches live to Foxglove on this port, e.g. 8765; 0: off "
                "('' = params file)",
            ),
            DeclareLaunchArgument(
                'foxglove_host',
                default_value='',
                description="address the tester's Foxglove server binds, e.g. 0.0.0.0 ('' = params file: "
                '127.0.0.1)',
            ),
            DeclareLaunchArgument(
                'use_sim_time',
                default_value=FLAG_DEFAULTS['use_sim_time'],
                description='follow /clock (bag replay with --clock)',
            ),
            DeclareLaunchArgument(
                'dds_transport',
                default_value='shm',
                description='shm: Fast DDS shared memory large enough for raw full-size frames '
                '(config/fastdds_shm.xml) unless the environment already chooses | default: DDS as installed',
            ),
            DeclareLaunchArgument(
                'autostart',
                default_value=FLAG_DEFAULTS['autostart'],
                description='configure and activate both managed nodes (false: they wait, unconfigured, '
                'for `ros2 lifecycle set`)',
            ),
            *_model_arguments(),
            OpaqueFunction(function=_nodes),
        ]
    )
