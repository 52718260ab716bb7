"""ament_python packaging of metavlm_ros: colcon on a ROS 2 distribution, or pip into a venv."""

from glob import glob

from setuptools import find_packages, setup

package_name = 'metavlm_ros'

setup(
    name=package_name,
    version='0.1.0',
    packages=find_packages(include=[package_name, f'{package_name}.*']),
    package_data={package_name: ['models/demo-*/*', 'models/demo-*/*/*']},
    data_files=[
        ('share/ament_index/resource_index/packages', [f'resource/{package_name}']),
        (f'share/{package_name}', ['package.xml']),
        (f'share/{package_name}/launch', glob('launch/*.launch.py')),
        (
            f'share/{package_name}/config',
            glob('config/*.yaml') + glob('config/*.xml') + glob('config/*.json'),
        ),
        (f'share/{package_name}/config/criteria', glob('config/criteria/*.yaml')),
    ],
    python_requires='>=3.10',
    # ROS 2 Python packages come from the distribution (colcon) or from the `ros` extra (pip only).
    install_requires=[
        'numpy',
        'opencv-python-headless',
        'pymoo>=0.6.1',
        'scipy',
        # mobo's linear algebra on one BLAS thread
        'threadpoolctl',
        'torch',
        'transformers>=4.40',
        'tokenizers',
        'safetensors',
        'rosbags>=0.10',
        'rosbags-image',
        'tqdm',
        'pyyaml',
        'matplotlib',
        'pillow',
        'foxglove-sdk>=0.30',
        # the served backend (--backend openai), imported only when it is used
        'openai',
        # metavlm export --format parquet
        'duckdb',
    ],
    extras_require={
        'ros': [
            'ros-rclpy',
            'ros-rmw-fastrtps-cpp',
            'ros-sensor-msgs',
            'ros-std-msgs',
            'ros-diagnostic-msgs',
            'ros-lifecycle-msgs',
            'ros-rcl-lifecycle',
            'ros-std-srvs',
        ],
        'dask': ['dask[distributed]'],
        'test': ['pytest', 'mcap', 'ruff', 'protobuf', 'websockets'],
    },
    zip_safe=False,
    maintainer='metavlm_ros developers',
    maintainer_email='metavlm-ros@example.org',
    description='Search-based metamorphic testing of vision-language models in underwater robot software.',
    license='Apache-2.0',
    entry_points={
        'console_scripts': [
            'metavlm = metavlm_ros.cli:entry_point',
            'perception_node = metavlm_ros.ros.perception_node:entry_point',
            'tester_node = metavlm_ros.ros.tester_node:entry_point',
        ],
    },
)
