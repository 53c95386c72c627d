"""A real terminal: a run started with ``-d`` in a tmux pane outlives that terminal, and
``autotune monitor RUN`` in another one attaches to it, live, until ``autotune stop`` ends it."""

import re
import shutil
import sys

import pytest

from conftest import autotune, journal, wait_for
from test_daemon import copy_scripts, ok_recipe, ps_row, run_processes
from test_monitor_tmux import Pane, row

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None,
                       reason="tmux is not installed (apt-get install tmux) - a real terminal "
                              "cannot be driven without it"),
]


def test_monitor_attaches_to_a_detached_run_that_outlived_its_terminal(tmp_path):
    script = copy_scripts(tmp_path)
    recipe = ok_recipe(tmp_path, script)
    runs = tmp_path / "runs"
    env = f"cd {tmp_path} && env -u NO_COLOR -u COLUMNS -u LINES TERM=xterm-256color"
    first = Pane(f"autotune-d-{tmp_path.name}",
                 f"{env} {sys.executable} -m autotune run -d --recipe {recipe} --runs-dir "
                 f"{runs} {script} --log-interval 100; echo LAUNCHED=$?; sleep 600")
    second = None
    try:
        shown = first.wait_for(lambda t: "LAUNCHED=" in t, timeout_s=120,
                               what="autotune run -d to return")
        assert "LAUNCHED=0" in shown, shown
        rid = re.search(r"run (\S+) started, detached", shown).group(1)
        first.kill()  # the terminal it was started from closes: its shell is hung up
        wait_for(lambda: journal(runs / rid, "fullrun_progress"), timeout_s=90, poll_s=0.5,
                 what="the detached run training after its terminal closed")
        assert ps_row(tmp_path, rid)["state"] == "running"

        second = Pane(f"autotune-m-{tmp_path.name}",
                      f"{env} {sys.executable} -m autotune monitor {rid[:20]} --runs-dir "
                      f"{runs}; echo MONITOR-EXIT=$?; sleep 600", height=50)
        live = second.wait_for(lambda t: "samples/s" in t and "full run" in t and "│" in t,
                               timeout_s=60, what="the monitor's live view of the full run")
        assert "autotune run" in live and "ok.py" in live
        assert "samples/s" in row(live, "live")
        assert "MONITOR-EXIT=" not in live  # attached: it follows the run, it does not end

        stopped = autotune("stop", rid, "--runs-dir", str(runs), timeout=120)
        assert stopped.returncode == 0, stopped.stderr
        second.wait_for(lambda t: "MONITOR-EXIT=" in t, timeout_s=60,
                        what="the monitor to end with the run")
        end = second.text(history=True)
        assert "MONITOR-EXIT=0" in end
        assert "ended (exit 130)" in row(end, "phase")
        assert "exit code 130" in row(end, "full run")
        assert "Traceback" not in end and "\x1b" not in end
        # no rank, loader worker or controller left (the panes' own shells name the scripts too)
        assert wait_for(lambda: not run_processes(tmp_path, "probes.boot") and
                        not run_processes(tmp_path, "autotune run"), timeout_s=30,
                        what="no process of the run left")
    finally:
        first.kill()
        if second is not None:
            second.kill()
        for p in run_processes(tmp_path, "probes.boot") + \
                run_processes(tmp_path, "autotune run"):
            p.kill()
