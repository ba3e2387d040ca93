#!/usr/bin/env bash
# The GPU machine's Triton beside the development venv, for the sm_90 build check and the
# interpreter tests: bash test/kernels/gpu_triton_venv.sh   (prints the venv's python)
#
# Makes .venv-gpu-triton (ignored by git) from the Python of .venv with only triton
# $GPU_TRITON (3.6.0: the H200 benchmark machine's, docs/benchmarks.md) installed in it; a
# .pth file then adds .venv's site-packages after its own, so torch, numpy, pytest and the
# rest are .venv's and only Triton differs. numpy is .venv's (< 2.3, requirements/base.txt),
# which Triton 3.6's interpreter also needs: it fails with numpy >= 2.4 on loop bounds read
# from memory (the launchers refuse that pair with a message). About 20 s from a package
# cache; a second run only checks. Exits 1 when pip cannot install that Triton here (then
# test/kernels/test_sm90_compile.py runs with the local Triton instead).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
version=${GPU_TRITON:-3.6.0}
venv="$root/.venv-gpu-triton"
main_python="$root/.venv/bin/python"
[ -x "$main_python" ] || { echo "gpu_triton_venv: no .venv: run scripts/setup.sh" >&2; exit 1; }
if [ -x "$venv/bin/python" ] \
    && "$venv/bin/python" -c "import triton, sys; sys.exit(triton.__version__ != '$version')" \
      2>/dev/null; then
  echo "$venv/bin/python"
  exit 0
fi
rm -rf "$venv"
base=$("$main_python" -c 'import sys; print(sys._base_executable)')
"$base" -m venv --without-pip "$venv" >&2
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
main_site=$("$main_python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if ! "$main_python" -m pip install -q --no-deps --disable-pip-version-check --timeout 20 \
    --retries 1 --target "$site" "triton==$version" >&2; then
  rm -rf "$venv"
  echo "gpu_triton_venv: triton $version is not installable here" >&2
  exit 1
fi
echo "import site; site.addsitedir('$main_site')" > "$site/zz_development_venv.pth"
echo "$venv/bin/python"
