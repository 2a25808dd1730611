#!/usr/bin/env bash
# The CIFAR-10 ranking plan, resumable: every job leaves a record under RECORDS (commit them) and a job whose
# record exists is skipped, so the script can be stopped and run again, on this machine or another.
#   1. vit_cifar with every backend (or the comma-separated BACKENDS), 3 epochs, seed 0   -> RECORDS/3ep
#      and vit_cifar + ToMe (model.token_reduction=tome) with global                     -> RECORDS/3ep/vit_cifar+tome
#   2. 10 epochs: vit_cifar + global, vit_cifar + window, swin_cifar + window and the most accurate other
#      backend at 3 epochs                                                               -> RECORDS/10ep
#   3. seed 1 at 3 epochs for global, window and the three most accurate others          -> RECORDS/3ep
# Accuracy only (it does not depend on machine load): run it at low priority beside other work, and measure
# speed separately on a quiet machine (scripts/benchmark.py --mode models, see docs/results.md).
#   nice -n 19 bash scripts/sweep_cifar10.sh [RECORDS] [BACKENDS]   (default results/cifar10, all backends)
# On Linux with autogroup scheduling (/proc/sys/kernel/sched_autogroup_enabled = 1) nice only ranks processes
# of one terminal session; to yield to other sessions as well, run `echo 19 > /proc/self/autogroup` first.
#   extra Hydra overrides via SWEEP_ARGS, e.g. SWEEP_ARGS="trainer.precision=32" where bf16 is emulated
# Before the first job the script checks that the records folders are writable and that data.root holds train/;
# a job whose record cannot be written fails, and the sweep's summary lists it as failed.
set -euo pipefail
cd "$(dirname "$0")/.."
RECORDS="${1:-results/cifar10}"
BACKENDS="${2:-glob(*)}"
read -r -a EXTRA <<< "${SWEEP_ARGS:-}"
# checkpoints and logs (git-ignored); a fixed folder, so that a job stopped half-way resumes from its last.ckpt
# when the script runs again with the same backend list
SWEEP="${SWEEP_DIR:-multirun/zoo_cifar10/plan}"
run() {  # run <name> <overrides...>: one multirun into its own sweep folder
    local name="$1"; shift
    python train.py -m experiment=zoo_cifar10 hydra.sweep.dir="$SWEEP/$name" "${EXTRA[@]}" "$@"
}
top() {  # top <k> <exclude>: the k most accurate vit_cifar backends at 3 epochs
    python scripts/compare.py "$RECORDS/3ep" --top "$1" --exclude "$2"
}
fail() { echo "error: $*" >&2; exit 2; }
# before the first job: every records folder writable (a probe file written and removed) and the data present
for dir in "$RECORDS/3ep" "$RECORDS/10ep"; do
    mkdir -p "$dir" 2>/dev/null && probe=$(mktemp "$dir/.write-test.XXXXXX" 2>/dev/null) && rm -f "$probe" \
        || fail "records folder $dir is not writable; give another RECORDS folder (first argument)"
done
DATA=$(python train.py experiment=zoo_cifar10 "${EXTRA[@]}" --cfg job --resolve --package data.root) \
    || fail "cannot compose experiment=zoo_cifar10 ${SWEEP_ARGS:-}"
DATA=$(tail -n 1 <<< "$DATA")
[ -d "$DATA/train" ] && [ -n "$(ls -A "$DATA/train")" ] \
    || fail "data.root=$DATA has no train/<class>/ images; set VITZOO_CIFAR10 (or data.root in SWEEP_ARGS)"

run 3ep "attention=$BACKENDS" record_dir="$RECORDS/3ep"
run 3ep_tome model.token_reduction=tome attention=global record_dir="$RECORDS/3ep"
best=$(top 1 global,window)
run 10ep_vit "attention=global,window${best:+,$best}" trainer.max_epochs=10 record_dir="$RECORDS/10ep"
run 10ep_swin model=swin_cifar attention=window trainer.max_epochs=10 record_dir="$RECORDS/10ep"
others=$(top 3 global,window)
run seed1 "attention=global,window${others:+,$others}" seed=1 record_dir="$RECORDS/3ep"
python scripts/compare.py "$RECORDS"
