"""The suite's xdist scheduling: xdist groups as `--dist loadgroup` runs them, and one worker
set aside for the tests that mostly wait on the clock.

On three workers or more, the tests of the `SLEEP` group, which spend most of their wall time
waiting (their scripts sleep out slow steps), run on the last worker, one after another, beside
the others that take everything else, so that the waiting does not hold up a worker the
CPU-bound tests could use. The set-aside worker takes nothing else; once its group is done it
stops. With fewer than three workers every group runs as plain loadgroup runs it. CI runs two
workers on its two cores: on three, the third test's load under the timed tunes (though their
scripts mostly wait, the tuner and the ranks' start-ups do not) left one tune with a budget it
could not use (`.ci/run`).
"""

import pytest

try:
    from xdist.scheduler import LoadGroupScheduling
except ImportError:  # without pytest-xdist the suite runs in one process: nothing to schedule
    LoadGroupScheduling = object

# the xdist group of tests that mostly wait on the clock (see the module's docstring)
SLEEP = "sleep-bound"
ASIDE_FROM_WORKERS = 3  # the fewest workers that set one aside


class SleepAsideScheduling(LoadGroupScheduling):
    """`LoadGroupScheduling` with the `SLEEP` group on a worker of its own (the last one)."""

    _chosen = None  # the aside worker, once chosen (a worker restarted later is not it)

    def _aside(self):
        """The worker set aside for the `SLEEP` group (the last of the first ones, while it
        is in the run), or None with too few workers."""
        if self._chosen is None and len(self.nodes) >= ASIDE_FROM_WORKERS:
            self._chosen = max(self.nodes, key=lambda n: int(n.gateway.id.lstrip("gw") or 0))
        return self._chosen if self._chosen in self.nodes else None

    def _assign_work_unit(self, node) -> None:
        """Send a node its next unit: the aside worker the `SLEEP` group only (it stops when
        that is taken), the others anything else first."""
        aside = self._aside()
        if aside is None:
            return super()._assign_work_unit(node)
        if node is aside:
            scope = SLEEP if SLEEP in self.workqueue else None
            if scope is None:
                if not node.shutting_down:
                    node.shutdown()
                return
        else:  # (the group itself only if the aside worker somehow never took it)
            scope = next((s for s in self.workqueue if s != SLEEP), SLEEP)
        work_unit = self.workqueue.pop(scope)
        self.assigned_work.setdefault(node, {})[scope] = work_unit
        collection = self.registered_collections[node]
        node.send_runtest_some([collection.index(nodeid)
                                for nodeid, done in work_unit.items() if not done])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under `--dist loadgroup` (pyproject's addopts), `SleepAsideScheduling`."""
    if config.getvalue("dist") != "loadgroup":
        return None
    return SleepAsideScheduling(config, log)
