#!/bin/bash
# The GPU checks in one device call of under ten minutes (a session is lent 15 minutes of device
# time, machine start included); each step under its own timeout, so that what ran is reported
# whatever stops. Run from the repo root with the wheels autotune needs in .whl (docs/benchmarks.md,
# "On a lent H100/H200"):
#
#   bash bench/gpu_device_call.sh [parity]        the default: the kit's env and gpu tests, then
#                                                 the parity bench on 4 ranks under MPS and on 1
#                                                 rank (plain, autotune run, probe)
#   bash bench/gpu_device_call.sh tune [BUDGET]   the kit's env and tests, a tune (3m), the side by
#                                                 side with the tuner's recipe, a probe if time is
#                                                 left
#
# Everything comes back in $OUT: gpu_proof.json and gpu_proof.md (the kit's reports), parity.json
# and parity.log (the bench's), and gp.tgz (the logs).
cd "$(dirname "$0")/.." || exit 9
OUT=${OUT:?the device tool sets OUT}
mode=${1:-parity}
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 9
    export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1
kit=(python3 bench/gpu_proof.py --out /tmp/gp --work /tmp/gpw)
t0=$(date +%s)
at() { echo "== $1 rc $2 at $(( $(date +%s) - t0 )) s"; }
left() { echo $(( 560 - ($(date +%s) - t0) )); }
nvidia-smi --query-gpu=name,driver_version,memory.used,utilization.gpu --format=csv
timeout 90 "${kit[@]}" --steps env,tests; at env,tests $?
if [ "$mode" = tune ]; then
    # 3m by default: on the H200 a 2-minute tune found 4 ranks under MPS (+55%) but had time for
    # one confirmation round, which cannot switch (2026-11-29); the side by side then checks the
    # switched recipe's claim against the same ranks started plain
    timeout 250 "${kit[@]}" --steps tune --budget "${2:-3m}" \
        --tune-space instances=1:4 thread_pct=25:100
    at tune $?
    timeout 200 "${kit[@]}" --steps measure --seconds 8 --rounds 2 --instances 4 --time-sliced none
    at measure $?
    if [ "$(left)" -gt 55 ]; then
        timeout "$(left)" "${kit[@]}" --steps probe --probe-seconds 15; at probe $?
    fi
else
    # 4 ranks under MPS at 100% each (the config the kit found 1.81x one rank started plain and
    # 1.19x through `autotune run`), then 1 rank: 3 ways x 3 rounds; a run stops after 20 of the
    # script's lines past its first (~5 s at 4 ranks), a probe within 30 s. The report is
    # rewritten after every round: a run cut short still leaves its rounds.
    timeout "$(left)" python3 bench/bench_parity.py --device gpu --configs cuda-4r-mps100 cuda-1r \
        --rounds 3 --lines 20 --span 6 --seconds 30 --probe-min-s 8 --out "$OUT/parity.json" \
        2>&1 | tee "$OUT/parity.log"
    at parity "${PIPESTATUS[0]}"
fi
echo "== left behind:"; ps -eo pid,etimes,args | grep -E "train.py|mps-" | grep -v grep
cp /tmp/gp/gpu_proof.md /tmp/gp/gpu_proof.json "$OUT/" 2>/dev/null
logs=$(cd /tmp && find gpw -type f -size -3M \( -name '*.log' -o -name '*.jsonl' -o -name '*.json' \
       -o -name '*.toml' -o -name '*.xml' \) | head -400)
# shellcheck disable=SC2086  # the list is word-split on purpose: the names are the kit's own
tar czf "$OUT/gp.tgz" -C /tmp gp $logs
