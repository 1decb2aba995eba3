#!/usr/bin/env bash
# Build and install Horovod 0.28.1 from source into the environment of PYTHON (argument 1,
# default: python), against the torch already installed there. CPU/Gloo only.
#
# The recipe (no change to Horovod's source):
#   1. cmake < 4 (Horovod's CMakeLists predates CMake 4's policy removals).
#   2. C++17 appended *after* CMake's own -std=c++14, via a compiler launcher
#      (CXXFLAGS does not work: CMake puts it first, and the last -std wins).
#   3. PyTorch + Gloo only; no TensorFlow, MXNet or MPI.
#   4. --no-build-isolation, so it compiles against *this* torch, and --no-cache-dir,
#      so pip never reuses a wheel built against another torch.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-python}
start=$SECONDS

# Step 1
"$PY" -m pip install --disable-pip-version-check "cmake<4" "setuptools>=64" wheel
export PATH="$(dirname "$("$PY" -c 'import sys; print(sys.executable)')"):$PATH"
export CMAKE_POLICY_VERSION_MINIMUM=3.5     # harmless with cmake<4; needed with cmake>=4
# Step 2
export CMAKE_CXX_COMPILER_LAUNCHER="$PWD/scripts/cxx17-launcher.sh"
# Step 3
export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1
export HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_MPI=1
export MAKEFLAGS="-j$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN)"
# Step 4 (a broken earlier install, e.g. built for another torch, would count as satisfied)
"$PY" -m pip uninstall -y -q horovod 2>/dev/null || true
"$PY" -m pip install --disable-pip-version-check --no-build-isolation --no-cache-dir \
    -v horovod==0.28.1
"$PY" -c 'import horovod.torch, horovod; print("horovod", horovod.__version__, "OK")'
echo "horovod build took $((SECONDS - start)) s"
