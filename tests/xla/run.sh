#!/usr/bin/env bash
# The XLA test tier: run tests/xla for real on torch_xla's PJRT CPU runtime.
#
# torch_xla 2.9 needs torch==2.9.0 exactly, so it lives in its own virtual environment (never the
# main one). This script creates that environment when it is missing or broken, then runs
#   PJRT_DEVICE=CPU ACCEL_REQUIRE_XLA=1 python -m pytest -q tests/xla
# inside it. ACCEL_REQUIRE_XLA=1 turns "torch_xla is not importable" from a skip into a failure,
# so this tier can never pass by skipping. If the environment cannot be created the script exits
# non-zero with a message saying why.
#
# Usage:  bash tests/xla/run.sh [extra pytest arguments]
# Env:    ACCEL_XLA_VENV   where the environment lives (default: <repo>/.xla-venv)
#         ACCEL_XLA_PYTHON the interpreter that creates it (default: python3; 3.10-3.13)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)"
VENV="${ACCEL_XLA_VENV:-$REPO/.xla-venv}"
BASE_PYTHON="${ACCEL_XLA_PYTHON:-python3}"
TORCH_PIN="2.9.0"
XLA_PIN="2.9.0"
SMALL_DEPS=(numpy safetensors tqdm "pytest>=7" pyyaml)
MARKER="$VENV/.accel-xla-ready"
PY="$VENV/bin/python"

fail() {
    echo "tests/xla/run.sh: FAILED: $*" >&2
    exit 1
}

say() {
    echo "tests/xla/run.sh: $*"
}

# True when the environment holds the pinned torch / torch_xla and the small deps, all importable.
imports_ok() {
    [ -x "$PY" ] || return 1
    (cd / && "$PY" - "$TORCH_PIN" "$XLA_PIN" <<'EOF'
import sys
import torch, torch_xla  # noqa: E401
import numpy, safetensors, tqdm, pytest, yaml  # noqa: E401,F401
want_torch, want_xla = sys.argv[1], sys.argv[2]
found = (torch.__version__.split("+")[0], torch_xla.__version__.split("+")[0])
if found != (want_torch, want_xla):
    sys.exit(f"found torch {found[0]} / torch_xla {found[1]}, "
             f"expected {want_torch} / {want_xla}")
EOF
    ) >/dev/null 2>&1
}

# True when the environment was completed (marker written last) and still imports.
venv_ok() {
    [ -f "$MARKER" ] && imports_ok
}

# True when `import accel` in the environment resolves to this checkout.
project_ok() {
    local where
    where=$(cd / && "$PY" -c 'import accel, pathlib; print(pathlib.Path(accel.__file__).resolve().parent.parent)' 2>/dev/null) || return 1
    [ "$where" = "$REPO" ]
}

create_venv() {
    if [ -e "$VENV" ]; then
        # Remove only something that is recognisably a virtual environment.
        [ -f "$VENV/pyvenv.cfg" ] || fail "$VENV exists but is not a virtual environment" \
            "(no pyvenv.cfg); remove it or set ACCEL_XLA_VENV to another path"
        say "environment at $VENV is incomplete or broken; recreating it"
        rm -rf "$VENV"
    fi
    command -v "$BASE_PYTHON" >/dev/null 2>&1 || fail "no '$BASE_PYTHON' interpreter found to" \
        "create $VENV; install Python 3.10-3.13 or set ACCEL_XLA_PYTHON"
    say "creating $VENV with torch==$TORCH_PIN torch-xla==$XLA_PIN (about 7 GB, a few minutes)"
    "$BASE_PYTHON" -m venv "$VENV" || fail "'$BASE_PYTHON -m venv $VENV' failed; install" \
        "the venv module (e.g. apt-get install python3-venv)"
    "$PY" -m pip install -q --disable-pip-version-check "torch==$TORCH_PIN" \
        "torch-xla==$XLA_PIN" "${SMALL_DEPS[@]}" \
        || fail "pip could not install torch==$TORCH_PIN torch-xla==$XLA_PIN into $VENV" \
            "(no network to the package index, no wheel for this Python, or disk full; see" \
            "pip's output above)"
    if ! imports_ok; then
        (cd / && "$PY" -c "import torch, torch_xla, numpy, safetensors, tqdm, pytest, yaml; print('torch', torch.__version__, 'torch_xla', torch_xla.__version__)") || true
        fail "$VENV was installed but the pinned torch / torch_xla (or a small dep) do not" \
            "import, or have other versions (see above)"
    fi
    : >"$MARKER"
}

if venv_ok; then
    say "using existing environment $VENV"
else
    create_venv
    # venv_ok checks the marker, which create_venv writes last.
    venv_ok || fail "environment at $VENV is still not usable after creating it"
fi

if ! project_ok; then
    say "installing this checkout into $VENV (pip install --no-deps -e .)"
    (cd "$REPO" && "$PY" -m pip install -q --disable-pip-version-check --no-deps -e .) \
        || fail "could not install the project into $VENV with 'pip install --no-deps -e .'"
    project_ok || fail "'import accel' in $VENV does not resolve to $REPO after installing it"
fi

cd "$REPO"
say "running: PJRT_DEVICE=CPU ACCEL_REQUIRE_XLA=1 $PY -m pytest -q tests/xla $*"
# The tier's own variables win over anything inherited (a CI venv, a stale ACCEL_DEVICE).
unset ACCEL_DEVICE XRT_TPU_CONFIG TPU_NUM_DEVICES GPU_NUM_DEVICES CPU_NUM_DEVICES || true
export PJRT_DEVICE=CPU ACCEL_REQUIRE_XLA=1
exec "$PY" -m pytest -q tests/xla "$@"
