#!/usr/bin/env bash
# `pip install` of the package from the repository into a fresh folder, then an
# import and a small round trip from there (run by ctest as python_pip_install:
# what a user's `pip install .` does, with the project's environment's Python).
# Usage: pip_install_check.sh PYTHON SOURCE_DIR WORK_DIR
set -euo pipefail
py="$1" src="$2" work="$3"
rm -rf "$work"
mkdir -p "$work"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
# The release build beside this test already compiles every SIMD target with
# the same CMake files; here only this machine's best target (plus scalar) is
# compiled, which checks the pip/scikit-build-core route in a third of the
# time (CI's budget). KVCACHE_PIP_CHECK_ALL_TARGETS=1 builds exactly what a
# user's `pip install .` builds.
native=(--config-settings=cmake.define.KVCACHE_HWY_NATIVE_ONLY=ON)
if [ "${KVCACHE_PIP_CHECK_ALL_TARGETS:-0}" = 1 ]; then native=(); fi
"$py" -m pip install --quiet --disable-pip-version-check --no-build-isolation --no-deps \
  "${native[@]}" --target "$work/site" "$src"
cd "$work"
PYTHONPATH="$work/site" "$py" - <<'PY'
import numpy as np, os, kvcache
assert os.path.dirname(kvcache.__file__).endswith("site/kvcache"), kvcache.__file__
assert os.path.exists(os.path.join(os.path.dirname(kvcache.__file__), "_kvcache.pyi"))
g = kvcache.Geometry(2, 2, 32, 16)
pool = kvcache.BlockPool(g, "f32", num_blocks=4)
with kvcache.SequenceCache.paged(pool) as s:
    k = np.arange(2 * 3 * 2 * 32, dtype=np.float32).reshape(2, 3, 2, 32)
    s.append(k, k)
    assert (s.head_keys(1, 1) == k[1, :, 1]).all()
print("pip install: ok,", kvcache.simd_target())
PY
