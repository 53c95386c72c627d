"""Between the step clock's sampled steps the step hooks that have nothing to do step aside
(issue 39): the optimizer's pre-hook and the backward wrapper each cost a 0.5 ms step ~2 us
inside its loop (`bench/hook_cost.py`). A timed step still has them all, every step and sample
is still counted, and a script whose steps nest, a wrapper of ``torch.autograd.backward`` put
there by someone else, and a forked child keep what they need. Each case runs in a process of
its own: the hooks patch torch where they are installed."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LOOP = r"""
import json, os, sys
import torch
from torch import nn
from torch.optim import optimizer as topt
from torch.utils.data import DataLoader, TensorDataset
from probes.intercept import Interceptor
from probes.meter import Meter

case = sys.argv[1]
torch.set_num_threads(1)
if case == "mapping":  # a torch that keeps its global pre-hooks in something not a dict
    from collections.abc import MutableMapping

    class Hooks(MutableMapping):
        def __init__(self):
            self.kept = {}

        def __getitem__(self, key):
            return self.kept[key]

        def __setitem__(self, key, value):
            self.kept[key] = value

        def __delitem__(self, key):
            del self.kept[key]

        def __iter__(self):
            return iter(self.kept)

        def __len__(self):
            return len(self.kept)

    topt._global_optimizer_pre_hooks = Hooks()
meter = Meter({})
Interceptor(meter, {}).install()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.01)


class Wrapper(torch.optim.Optimizer):
    # a wrapper optimizer (Lookahead's shape): its step runs the inner one's
    def __init__(self, inner):
        self.inner = inner
        super().__init__(inner.param_groups, {})

    def step(self, closure=None):
        return self.inner.step(closure)


if case == "nested":
    opt = Wrapper(opt)
loader = DataLoader(TensorDataset(torch.randn(512, 16), torch.randint(0, 2, (512,))),
                    batch_size=4)


def ours_in():
    return getattr(torch.autograd.backward, "__name__", "") == "autograd_backward"


def pre_in():
    return any("before_step" in getattr(h, "__qualname__", "")
               for h in topt._global_optimizer_pre_hooks.values())


theirs_called = [0]
rows, steps, child, wrapped_at = [], 0, None, None
for epoch in range(3):
    for x, y in loader:
        if case == "theirs" and wrapped_at is None and steps >= 200 and ours_in():
            wrapped_at = [steps, meter.backwards]  # over ours, on a timed step
            under = torch.autograd.backward

            def theirs(*args, **kwargs):
                theirs_called[0] += 1
                return under(*args, **kwargs)

            torch.autograd.backward = theirs
        if case == "fork" and steps == 200 and meter.fast:
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.write(w, json.dumps([ours_in(), pre_in(), meter.fast]).encode())
                os._exit(0)
            os.close(w)
            child = json.loads(os.read(r, 1000).decode())
            os.waitpid(pid, 0)
        rows.append([meter.clock.timed, meter.fast, ours_in(), pre_in()])
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        steps += 1
print(json.dumps({"rows": rows, "steps": steps, "counted": meter.steps,
                  "samples": meter.samples, "every": meter.clock.every,
                  "parts": meter.clock.snapshot(), "theirs": theirs_called[0],
                  "theirs_kept": torch.autograd.backward.__name__ == "theirs", "child": child,
                  "wrapped_at": wrapped_at, "backwards": meter.backwards}))
"""


def run_loop(case: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("AUTOTUNE_ADDR", None)
    done = subprocess.run([sys.executable, "-c", LOOP, case], capture_output=True, text=True,
                          env=env, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_timed_step_has_every_hook_and_the_steps_between_have_only_the_counting_ones():
    got = run_loop("plain")
    rows = got["rows"]
    assert got["counted"] == got["steps"] == 384 and got["samples"] == 4 * 384
    assert got["every"] > 1, got["every"]
    timed = [r for r in rows if r[0]]
    between = [r for r in rows if r[1]]
    assert timed and all(r[2] and r[3] for r in timed)  # both in for every timed step
    assert between and not any(r[2] or r[3] for r in between)  # out between them
    # after the calibration nearly every step is between sampled ones
    assert len(between) > 0.8 * len(rows)
    # the sampled sums, scaled, still hold every part of the loop's steps
    assert all(got["parts"][p] > 0 for p in ("data", "forward", "backward", "optimizer"))


def test_steps_that_nest_keep_the_pre_hook_and_are_timed_as_one_step():
    got = run_loop("nested")
    rows = got["rows"]
    assert got["every"] > 1 and got["samples"] == 4 * got["steps"]
    assert all(r[3] for r in rows)  # the pre-hook never left
    assert any(r[1] and not r[2] for r in rows)  # the backward wrapper still did
    assert got["parts"]["optimizer"] > 0 and got["parts"]["backward"] > 0


def test_a_wrapper_put_over_the_backward_pass_later_stays_and_ours_goes_on_under_it():
    got = run_loop("theirs")
    at, backwards_then = got["wrapped_at"]
    later = got["steps"] - at
    assert got["theirs_kept"] and got["theirs"] == later > 0
    # ours, under theirs, is no longer swapped out: it runs on every later step
    assert got["backwards"] - backwards_then == later
    assert got["counted"] == got["steps"] and got["samples"] == 4 * got["steps"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_child_forked_between_sampled_steps_starts_with_every_hook_in():
    got = run_loop("fork")
    assert got["child"] is not None, "the loop never forked between sampled steps"
    ours, pre, fast = got["child"]
    assert ours and pre and not fast
    assert got["counted"] == got["steps"]


def test_a_torch_that_keeps_its_global_pre_hooks_otherwise_keeps_ours_in_and_counts_the_same():
    got = run_loop("mapping")
    rows = got["rows"]
    assert got["counted"] == got["steps"] == 384 and got["samples"] == 4 * 384
    assert all(r[3] for r in rows)  # the pre-hook never left
    assert any(r[1] and not r[2] for r in rows)  # the backward wrapper still did
    assert got["parts"]["optimizer"] > 0 and got["parts"]["backward"] > 0
