#!/usr/bin/env bash
# Wheels of what vitzoo imports and the GPU machines' image lacks, into .whl/ (git-ignored), built here from the
# versions this environment has installed (pure Python: they install on the device's Python 3.12 too).
# The image has torch, timm, lightning, torchmetrics, safetensors, matplotlib, tabulate and portalocker
# (the GPU machine's package list); vitzoo needs fvcore (FLOPs) with iopath and termcolor, and train.py Hydra.
#   bash scripts/gpu_wheels.sh          then: device run with carry [".whl"], command: bash scripts/gpu_checks.sh
set -euo pipefail
cd "$(dirname "$0")/.."
NAMES='fvcore|iopath|termcolor|yacs|hydra-core|omegaconf|antlr4-python3-runtime'
PINS=$(python -m pip freeze 2>/dev/null | grep -i -E "^($NAMES)==" || true)
[ -n "$PINS" ] || { echo "none of $NAMES is installed here: pip install -e . first" >&2; exit 1; }
mkdir -p .whl
python -m pip wheel -q --no-deps --no-cache-dir -w .whl $PINS
ls -l .whl
