#!/usr/bin/env bash
# Set up .venv if needed, then run the main job: the node serving 4 simulated robots for 20 s
# on the built-in tiny checkpoint, with a live per-robot table. Extra arguments go to the demo
# (python -m vla_sched.ros.demo --help).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/scripts/setup.sh"
cd "$root"
# The messages' type-support libraries are installed in .venv/lib (the ROS wheels add it to
# the library path themselves; a sourced ROS 2 install does not).
export LD_LIBRARY_PATH="$root/.venv/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export ROS_AUTOMATIC_DISCOVERY_RANGE=${ROS_AUTOMATIC_DISCOVERY_RANGE:-LOCALHOST}
exec .venv/bin/python -m vla_sched.ros.demo --robots 4 --duration 20 "$@"
