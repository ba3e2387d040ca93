#!/usr/bin/env bash
# The prepared GPU run under a hard overall timeout: bash bench/gpu_check.sh OUT [options]
# Options go to python -m bench.gpu_check (--budget-s, --workdir, --parts, --dry-run). The parts
# share --budget-s (510 s by default); the whole run is killed at GPU_CHECK_TIMEOUT_S (530 s),
# so it ends within 9 minutes whatever happens. PYTHON picks the interpreter (python3).
set -euo pipefail
if [[ $# -lt 1 || $1 == -* ]]; then
  echo "usage: bash bench/gpu_check.sh OUT_DIR [python -m bench.gpu_check options]" >&2
  exit 2
fi
mkdir -p "$1"
out=$(cd "$1" && pwd)
shift
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
exec timeout --kill-after=10 "${GPU_CHECK_TIMEOUT_S:-530}" "${PYTHON:-python3}" \
  -m bench.gpu_check --out "$out" "$@"
