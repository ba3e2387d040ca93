#!/usr/bin/env bash
# Make an install prefix (the development venv) serve this checkout's launch files,
# parameters and executables as an installed package does, so that `ros2 launch vla_sched ...`
# and `ros2 run vla_sched ...` work from it as they do after colcon:
#
#   bash scripts/link_share.sh PREFIX     # called by scripts/setup.sh with PREFIX=.venv
#
# PREFIX/share/vla_sched/launch and .../config link to launch/ and config/, and
# PREFIX/lib/vla_sched links to nodes/, so edits in the checkout need no reinstall (as the
# sources, which the venv imports from the checkout). The package's ament index entry and
# share/vla_sched/local_setup.bash come from the CMake install of the messages.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ $# = 1 ] || { echo "usage: $0 PREFIX" >&2; exit 2; }
prefix=$1

# link TARGET LINK: LINK points at TARGET, replacing a link or a copy left by an earlier install.
link() {
  if [ -e "$2" ] && [ ! -L "$2" ]; then rm -rf "$2"; fi
  ln -sfn "$1" "$2"
}

mkdir -p "$prefix/share/vla_sched" "$prefix/lib"
link "$root/launch" "$prefix/share/vla_sched/launch"
link "$root/config" "$prefix/share/vla_sched/config"
link "$root/nodes" "$prefix/lib/vla_sched"
