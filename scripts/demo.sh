#!/usr/bin/env bash
# Set up .venv if needed, then run the main job. Extra arguments go to the demo.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/scripts/setup.sh"
cd "$root"
export ROS_AUTOMATIC_DISCOVERY_RANGE=${ROS_AUTOMATIC_DISCOVERY_RANGE:-LOCALHOST}
exec .venv/bin/python -m vla_sched.ros.roundtrip demo "$@"
