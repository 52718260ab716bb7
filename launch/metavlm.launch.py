"""Launch the metavlm_ros perception and tester nodes on a camera topic."""

import os

from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.launch_description import LaunchDescription
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare

PACKAGE = 'metavlm_ros'
# The tester's probes and the perception node's answers meet here (both nodes are remapped to it),
# away from any other node's `probe` topic on the robot.
PROBE_TOPIC = '/metavlm/probe'


def _nodes(context, *args, **kwargs):
    """Build both nodes once the launch arguments are known."""

    def arg(name: str) -> str:
        return LaunchConfiguration(name).perform(context)

    camera_topic = arg('camera_topic')
    params_file = arg('params_file')
    use_sim_time = arg('use_sim_time').lower() in ('true', '1', 'yes')
    # Empty arguments leave the parameter file's value in force.
    model_overrides = {name: arg(name) for name in ('backend', 'model') if arg(name)}
    camera_remaps = [('image', camera_topic), ('image/compressed', camera_topic + '/compressed')]
    probe_remaps = [('probe', PROBE_TOPIC), ('probe/prediction', PROBE_TOPIC + '/prediction')]
    from metavlm_ros.ros.transport import local_transport_env

    # Shared memory with room for raw full-size camera frames (dds_transport:=default: DDS as installed).
    transport_env = local_transport_env(os.environ, arg('dds_transport'))

    perception = Node(
        package=PACKAGE,
        executable='perception_node',
        name='metavlm_perception',
        output='screen',
        parameters=[params_file, {'use_sim_time': use_sim_time, **model_overrides}],
        remappings=camera_remaps + probe_remaps,
        additional_env=transport_env,
    )
    tester_overrides = {'use_sim_time': use_sim_time, **model_overrides}
    if arg('vlm_endpoint'):
        tester_overrides['vlm_endpoint'] = arg('vlm_endpoint')
    tester = Node(
        package=PACKAGE,
        executable='tester_node',
        name='metavlm_tester',
        output='screen',
        parameters=[params_file, tester_overrides],
        remappings=camera_remaps + probe_remaps,
        additional_env=transport_env,
    )
    return [perception, tester]


def generate_launch_description() -> LaunchDescription:
    """Arguments: camera_topic, backend, model, params_file, vlm_endpoint, use_sim_time, dds_transport."""
    default_params = PathJoinSubstitution([FindPackageShare(PACKAGE), 'config', 'metavlm.yaml'])
    return LaunchDescription(
        [
            DeclareLaunchArgument(
                'camera_topic', default_value='/camera/image_raw', description='camera image topic'
            ),
            DeclareLaunchArgument(
                'backend', default_value='', description="clip | blip | instructblip ('' = params file)"
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
                'use_sim_time', default_value='false', description='follow /clock (bag replay with --clock)'
            ),
            DeclareLaunchArgument(
                'dds_transport',
                default_value='shm',
                description='shm: Fast DDS shared memory large enough for raw full-size frames '
                '(config/fastdds_shm.xml) unless the environment already chooses | default: DDS as installed',
            ),
            OpaqueFunction(function=_nodes),
        ]
    )
