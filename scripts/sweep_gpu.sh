#!/usr/bin/env bash
# Both CIFAR-10 sweeps on one GPU with bf16, each followed by its table and chart (scripts/compare.py).
# NOT RUN ON A GPU YET: the budgets below are estimates.
#   1. experiment=zoo_cifar10: every backend, 10 epochs of the fast recipe (experiment=cifar10_fast), one fresh
#      process per job; records go to OUT/records/10ep (not the CPU records in results/cifar10).
#   2. experiment=cifar10_pixels: every backend at 1,024 tokens per image, 60 steps x 64 images each: training
#      images/s and peak memory (a throughput/memory table; the accuracy column is meaningless after 60 steps).
# Both sweeps survive an interruption: run the script again with the same folder and finished jobs are skipped,
# unfinished ones resume from their last.ckpt.
#   bash scripts/sweep_gpu.sh [OUT_FOLDER]          (default multirun/gpu; data: env VITZOO_CIFAR10)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-multirun/gpu}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
GPU=(trainer=gpu trainer.precision=bf16-mixed data.num_workers=8 callbacks.rich_progress_bar=null)

python train.py -m experiment=zoo_cifar10 "${GPU[@]}" record_dir="$OUT/records/10ep" hydra.sweep.dir="$OUT/zoo_cifar10"
python scripts/compare.py "$OUT/records"

python train.py -m experiment=cifar10_pixels "${GPU[@]}" 'attention=glob(*)' trainer.max_epochs=-1 \
    trainer.max_steps=60 trainer.max_time=00:00:00:45 trainer.limit_val_batches=5 benchmark.steps=5 \
    ckpt_path=auto skip_finished=true hydra.sweep.dir="$OUT/cifar10_pixels"
python scripts/compare.py "$OUT/cifar10_pixels"
