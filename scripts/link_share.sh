#!/usr/bin/env bash
# Make an install prefix (the development venv) serve this checkout's launch files,
# parameters and executables as an installed package does, so that `ros2 launch vla_sched ...`
# and `ros2 run vla_sched ...` work from it as they do after colcon:
#
#   bash scripts/link_share.sh PREFIX     # called by scripts/setup.sh with PREFIX=.venv
#
# As colcon's --symlink-install lays them out: PREFIX/share/vla_sched/launch and .../config
# and PREFIX/lib/vla_sched are real folders holding one link per file of the checkout's
# launch/, config/ and nodes/, so edits in the checkout need no reinstall (as the sources,
# which the venv imports from the checkout). A folder link would not do: ros2launch finds
# `ros2 launch vla_sched <file>` by walking share/vla_sched without following links to
# folders. A file added to the checkout is linked by the next run (setup.sh runs this each
# time); links to files that are gone are removed. The package's ament index entry and
# share/vla_sched/local_setup.bash come from the CMake install of the messages.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ $# = 1 ] || { echo "usage: $0 PREFIX" >&2; exit 2; }
prefix=$1

# mirror SOURCE DEST: DEST becomes a folder of links to SOURCE's files (its subfolders as
# folders), replacing a folder link or a copy left by an earlier install.
mirror() {
  local source=$1 dest=$2 file rel
  if [ -L "$dest" ] || { [ -e "$dest" ] && [ ! -d "$dest" ]; }; then rm -f "$dest"; fi
  mkdir -p "$dest"
  while IFS= read -r -d '' file; do
    rel=${file#"$source"/}
    mkdir -p "$dest/$(dirname "$rel")"
    ln -sfn "$file" "$dest/$rel"
  done < <(find "$source" -type f -not -name '*.pyc' -not -path '*/__pycache__/*' -print0)
  # what no longer has a file in the checkout: links left dangling, and copies
  while IFS= read -r -d '' file; do
    rel=${file#"$dest"/}
    [ -f "$source/$rel" ] || rm -f "$file"
  done < <(find "$dest" \( -type l -o -type f \) -print0)
  while IFS= read -r -d '' file; do
    [ -L "$file" ] || ln -sfn "$source/${file#"$dest"/}" "$file"
  done < <(find "$dest" -type f -print0)
}

mirror "$root/launch" "$prefix/share/vla_sched/launch"
mirror "$root/config" "$prefix/share/vla_sched/config"
mirror "$root/nodes" "$prefix/lib/vla_sched"
