#!/bin/bash
# The GPU proof kit in one device call of under ten minutes (a session is lent 15 minutes of
# device time, machine start included): env and the gpu tests, a tune, the side by side with the
# tuner's recipe, then a probe if time is left; each step under its own timeout, so that what ran
# is reported whatever stops. Everything comes back as $OUT/gp.tgz (reports and logs) and
# $OUT/gpu_proof.md. Run from the repo root with the wheels autotune needs in .whl
# (docs/benchmarks.md, "GPU proof kit", "On a lent H100/H200"): bash bench/gpu_device_call.sh [BUDGET]
cd "$(dirname "$0")/.." || exit 9
OUT=${OUT:?the device tool sets OUT}
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 9
    export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1
kit=(python3 bench/gpu_proof.py --out /tmp/gp --work /tmp/gpw)
t0=$(date +%s)
at() { echo "== $1 rc $2 at $(( $(date +%s) - t0 )) s"; }
nvidia-smi --query-gpu=name,driver_version,memory.used,utilization.gpu --format=csv
timeout 75 "${kit[@]}" --steps env,tests; at env,tests $?
timeout 210 "${kit[@]}" --steps tune --budget "${1:-150s}" --tune-space instances=1:4 thread_pct=25:100
at tune $?
timeout 270 "${kit[@]}" --steps measure --seconds 10 --rounds 2 --instances 4 --time-sliced none
at measure $?
left=$(( 560 - ($(date +%s) - t0) ))
if [ "$left" -gt 55 ]; then
    timeout "$left" "${kit[@]}" --steps probe --probe-seconds 15; at probe $?
fi
echo "== left behind:"; ps -eo pid,etimes,args | grep -E "train.py|mps-" | grep -v grep
cp /tmp/gp/gpu_proof.md "$OUT/" 2>/dev/null
logs=$(cd /tmp && find gpw -type f -size -3M \( -name '*.log' -o -name '*.jsonl' -o -name '*.json' \
       -o -name '*.toml' -o -name '*.xml' \) | head -400)
# shellcheck disable=SC2086  # the list is word-split on purpose: the names are the kit's own
tar czf "$OUT/gp.tgz" -C /tmp gp $logs
