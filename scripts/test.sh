#!/usr/bin/env bash
# Set up .venv if needed, lint, and run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/scripts/setup.sh"
cd "$root"
# The messages' type-support libraries are installed in .venv/lib (the ROS wheels add it to
# the library path themselves; a sourced ROS 2 install does not).
export LD_LIBRARY_PATH="$root/.venv/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# ROS tests talk over DDS: keep them on this host, in a domain of their own for this run.
export ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST
export ROS_DOMAIN_ID=$(( $$ % 100 + 1 ))
export ROS_LOG_DIR=${ROS_LOG_DIR:-$(mktemp -d)}
echo "test: ROS_DOMAIN_ID=$ROS_DOMAIN_ID"

.venv/bin/ruff check .
.venv/bin/ruff format --check .
exec .venv/bin/python -m pytest "$@"
