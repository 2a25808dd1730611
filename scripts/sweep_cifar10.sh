#!/usr/bin/env bash
# The CIFAR-10 ranking plan (experiment=zoo_cifar10: the fast recipe, 10 epochs), resumable: every job leaves a
# record under RECORDS/10ep (commit them) and a job whose record exists is skipped, so the script can be stopped
# and run again, on this machine or another. Stages (SWEEP_STAGES, default all four, in this order):
#   vit       vit_cifar + global first (the recipe's own check), then every backend (or the comma-separated BACKENDS)
#   reducers  vit_cifar + global with each token reducer: ToMe, EViT, TokenLearner  -> <model>+<reducer>/global
#   swin      swin_cifar + window (model=swin_cifar replaces the recipe's vit_cifar_fast preset)
#   seeds     seed 1 for global, window and the five most accurate other vit_cifar backends
# Accuracy only (it does not depend on machine load): run it at low priority beside other work, and measure
# speed separately on a quiet machine (scripts/benchmark.py --mode models, see docs/results.md).
#   nice -n 19 bash scripts/sweep_cifar10.sh [RECORDS] [BACKENDS]   (default results/cifar10, all backends)
# Two streams on one machine: give each its own backend list, SWEEP_DIR and stages, e.g.
#   SWEEP_DIR=multirun/zoo_cifar10/a SWEEP_STAGES=vit bash scripts/sweep_cifar10.sh results/cifar10 afno,axial,...
# On Linux with autogroup scheduling (/proc/sys/kernel/sched_autogroup_enabled = 1) nice only ranks processes
# of one terminal session; to yield to other sessions as well, run `echo 19 > /proc/self/autogroup` first.
#   extra Hydra overrides via SWEEP_ARGS, e.g. SWEEP_ARGS="trainer.precision=32" where bf16 is emulated
# Before the first job the script checks that the records folder is writable and that data.root holds train/;
# a job whose record cannot be written fails, and the sweep's summary lists it as failed.
set -euo pipefail
cd "$(dirname "$0")/.."
RECORDS="${1:-results/cifar10}"
BACKENDS="${2:-glob(*)}"
STAGES="${SWEEP_STAGES:-vit reducers swin seeds}"
read -r -a EXTRA <<< "${SWEEP_ARGS:-}"
# checkpoints and logs (git-ignored); a fixed folder, so that a job stopped half-way resumes from its last.ckpt
# when the script runs again with the same backend list
SWEEP="${SWEEP_DIR:-multirun/zoo_cifar10/plan}"
run() {  # run <name> <overrides...>: one multirun into its own sweep folder
    local name="$1"; shift
    python train.py -m experiment=zoo_cifar10 hydra.sweep.dir="$SWEEP/$name" record_dir="$RECORDS/10ep" \
        "${EXTRA[@]}" "$@"
}
top() {  # top <k> <exclude>: the k most accurate vit_cifar backends at 10 epochs
    python scripts/compare.py "$RECORDS/10ep" --top "$1" --exclude "$2"
}
stage() { [[ " $STAGES " == *" $1 "* ]]; }
fail() { echo "error: $*" >&2; exit 2; }
# before the first job: the records folder writable (a probe file written and removed) and the data present
dir="$RECORDS/10ep"
mkdir -p "$dir" 2>/dev/null && probe=$(mktemp "$dir/.write-test.XXXXXX" 2>/dev/null) && rm -f "$probe" \
    || fail "records folder $dir is not writable; give another RECORDS folder (first argument)"
DATA=$(python train.py experiment=zoo_cifar10 "${EXTRA[@]}" --cfg job --resolve --package data.root) \
    || fail "cannot compose experiment=zoo_cifar10 ${SWEEP_ARGS:-}"
DATA=$(tail -n 1 <<< "$DATA")
[ -d "$DATA/train" ] && [ -n "$(ls -A "$DATA/train")" ] \
    || fail "data.root=$DATA has no train/<class>/ images; set VITZOO_CIFAR10 (or data.root in SWEEP_ARGS)"

if stage vit; then
    [[ "$BACKENDS" == "glob(*)" || ",$BACKENDS," == *",global,"* ]] && run global attention=global
    run vit "attention=$BACKENDS"
fi
if stage reducers; then
    for reducer in tome evit tokenlearner; do
        run "$reducer" "model.token_reduction=$reducer" attention=global
    done
fi
if stage swin; then
    run swin model=swin_cifar attention=window
fi
if stage seeds; then
    others=$(top 5 global,window)
    run seed1 "attention=global,window${others:+,$others}" seed=1
fi
python scripts/compare.py "$RECORDS"
