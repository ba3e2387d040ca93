"""pip install of vla_sched for development and engine-only use (no ROS needed to import).

The ROS messages are not built here: they come from CMake (``colcon build``, or
``scripts/setup.sh``, which installs them into the development venv).
"""

from setuptools import find_packages, setup

setup(
    name='vla_sched',
    version='0.1.0',
    description='Batch vision-language-action steps of many robots on one GPU, under ROS 2',
    license='Apache-2.0',
    python_requires='>=3.11',
    packages=find_packages(include=['vla_sched', 'vla_sched.*']),
    package_dir={'vla_sched.kernels': 'kernels'},
    install_requires=[
        'numpy>=2.0,<2.3',
        'torch',
        'safetensors>=0.4',
        'msgpack>=1.0',
        'pyzmq>=26',
        'pyyaml>=6',
        'psutil>=5.9',
    ],
    extras_require={
        'model': ['transformers>=5.17,<6', 'tokenizers>=0.20', 'pillow>=10'],
        'triton': ['triton>=3.6,<3.9'],
    },
    zip_safe=False,
)
