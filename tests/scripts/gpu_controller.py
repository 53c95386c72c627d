"""A controller process for fake-GPU tests: one trial of ``fake_gpu_rank.py``, as `autotune` runs it.

    gpu_controller.py RESULT_JSON INSTANCES THREAD_PCT MAX_S [RANK SCRIPT ARGS...]

Writes the trial's result to RESULT_JSON and exits 0; the MPS daemon it starts must be gone when
it exits, however it exits (that is what the tests check). Logs at INFO on stderr.
"""

import json
import logging
import sys
from pathlib import Path

from autotune.measuring.trial import TrialSpec, run_trial

HERE = Path(__file__).resolve().parent


def main():
    out, instances, pct, max_s, *rank_args = sys.argv[1:]
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    result = run_trial(TrialSpec.of(
        command=(str(HERE / "fake_gpu_rank.py"), *rank_args), instances=int(instances),
        knobs={"gpus": 2, "thread_pct": float(pct), "bucket_mb": 8}, log_dir=Path(out).parent / "logs",
        name="fakegpu", max_s=float(max_s), min_measure_s=2.0, hang_s=20.0, grace_s=5.0))
    Path(out).write_text(json.dumps(result.to_dict(), default=str))
    print(f"controller: trial ended: {result.outcome.value}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
