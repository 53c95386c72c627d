"""The search space: which knobs are tuned, over which values, and how a choice reaches a rank.

Pure: no processes, clocks or hardware. The knob table (`KNOBS`) says what each knob means and
how its default candidates follow from the machine and from what the baseline probe saw the
script use, with one rule per knob and device kind (``cpu``, ``gpu``) in `DOMAIN_RULES`.

Every knob's candidates are an ordered tuple of ints. The search works on positions in those
tuples, so the sampler sees the order (16 < 32 < 64) even where the values are not evenly spaced.
On CPU ``thread_pct`` is each rank's share of the host's cores; `threads_per_rank` turns it into
the thread count a rank gets. On GPUs it is each rank's MPS share of its GPU
(``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``), passed on as it is. The sum over ranks may exceed 100%.
"""

from __future__ import annotations

from autotune.tuning.space.build import (Space, SpaceRequest, batch_change_note, build,
                                         canonical, check_request, global_batch, job_devices,
                                         rank_knobs)
from autotune.tuning.space.knobs import (ALIASES, DESIGN_RULES, DOMAIN_RULES, KNOBS, ORDER,
                                         Baseline, Knob, Machine, bucket_candidates, divisors,
                                         geometric, knobs_text, linear, pct_for_threads,
                                         threads_per_rank)
from autotune.tuning.space.parse import (Range, explicit_fixes, parse_duration, parse_fix,
                                         parse_space)

__all__ = ["ALIASES", "DESIGN_RULES", "DOMAIN_RULES", "KNOBS", "ORDER", "Baseline", "Knob",
           "Machine", "Range", "Space", "SpaceRequest", "bucket_candidates", "build", "canonical",
           "check_request", "divisors", "explicit_fixes", "geometric", "job_devices", "knobs_text",
           "linear", "parse_duration", "parse_fix", "parse_space", "pct_for_threads", "rank_knobs",
           "threads_per_rank"]
