#!/usr/bin/env bash
# The device command of the GPU checks (vitzoo.bench.gpu_checks), sized to a time budget:
#   bash scripts/gpu_checks.sh [BUDGET_S=300] [LABEL] [more scripts/gpu_checks.py options, e.g. --steps flex,timm]
# 1. installs the wheels of .whl/ (scripts/gpu_wheels.sh builds them here; carry ".whl") into /tmp/site;
# 2. runs scripts/gpu_checks.py into /tmp/gpu_checks (no item starts after BUDGET_S seconds), its log beside;
# 3. copies gpu_checks.md and results.json to $OUT (the device tool's folder; default outputs/gpu_checks) and
#    packs the folder and the log into gpu_checks.tgz there.
# Give the device call a timeout of BUDGET_S plus ~90 s (the last item, the wheels, the start).
set -uo pipefail
cd "$(dirname "$0")/.."
BUDGET="${1:-300}"
LABEL="${2:-}"
RES=/tmp/gpu_checks
DEST="${OUT:-outputs/gpu_checks}"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
python3 scripts/gpu_checks.py --out "$RES" --budget "$BUDGET" --label "$LABEL" "${@:3}" 2>&1 | tee "$RES.log"
status=${PIPESTATUS[0]}
mkdir -p "$DEST"
cp "$RES"/gpu_checks.md "$RES"/results.json "$DEST"/ 2>/dev/null
tar czf "$DEST/gpu_checks.tgz" -C /tmp gpu_checks gpu_checks.log
exit "$status"
