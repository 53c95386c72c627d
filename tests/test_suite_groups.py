"""The suite's own scheduling: tests of one xdist group run on one worker, one after another,
and on three workers the `SLEEP` group has the last one to itself (`scheduling`).

The heaviest tunes (`conftest.HEAVY`) and the scripts with a fixed rendezvous port rely on it.
pytest 9.2 with pytest-xdist 3.8 ignored every group without a word (xdist rewrote a node id
pytest no longer reads), and CI failed on the collisions the groups were there to prevent."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the suite's scheduling hook, in the throwaway suites below
CONFTEST = f"import sys\nsys.path.insert(0, {str(ROOT / 'tests')!r})\n" \
           "from scheduling import pytest_xdist_make_scheduler  # noqa: F401\n"


def run_suite(tmp_path, workers: int, body: str) -> dict:
    """The throwaway suite ``body`` (which records each test's worker and times through
    ``ran(name)``) under the suite's own options and scheduling on ``workers`` workers: the
    record, by test name."""
    record = tmp_path / "ran"
    record.mkdir()
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_grouped.py").write_text(textwrap.dedent(f"""
        import json, os, time
        import pytest

        def ran(name, s=0.3):
            t0 = time.time()
            time.sleep(s)
            with open(os.path.join({str(record)!r}, name), "w") as f:
                json.dump([os.environ["PYTEST_XDIST_WORKER"], t0, time.time()], f)
        """) + textwrap.dedent(body))
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n",
                        str(workers), "-c", str(ROOT / "pyproject.toml"), "--rootdir",
                        str(tmp_path), str(tmp_path / "test_grouped.py")],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return {f.name: json.loads(f.read_text()) for f in record.iterdir()}


@pytest.mark.parametrize("workers", [2, 3])
def test_an_xdist_group_runs_on_one_worker_under_the_suites_own_options(tmp_path, workers):
    pytest.importorskip("xdist")
    runs = run_suite(tmp_path, workers, """
        @pytest.mark.parametrize("i", range(6))
        @pytest.mark.xdist_group("together")
        def test_grouped(i):
            ran(f"grouped{i}")

        @pytest.mark.parametrize("i", range(6))
        def test_free(i):
            ran(f"free{i}")
        """)
    assert len(runs) == 12
    grouped = {v[0] for k, v in runs.items() if k.startswith("grouped")}
    assert len(grouped) == 1, runs  # one worker (which runs one test at a time)
    # two workers did run the file: the check above means something (on three, the third is
    # set aside for the `SLEEP` group, which this file lacks: it runs nothing)
    assert len(grouped | {v[0] for k, v in runs.items() if k.startswith("free")}) == 2, runs


def test_on_three_workers_the_sleep_group_has_one_to_itself_beside_the_other_two(tmp_path):
    """What a run on three workers relies on: the `SLEEP` group's tests all on one worker, no other
    test there (so no more than two others run at once), and it runs beside them."""
    pytest.importorskip("xdist")
    from scheduling import SLEEP

    runs = run_suite(tmp_path, 3, f"""
        @pytest.mark.parametrize("i", range(2))
        @pytest.mark.xdist_group({SLEEP!r})
        def test_waits(i):
            ran(f"sleep{{i}}", 0.5)

        @pytest.mark.parametrize("i", range(4))
        @pytest.mark.xdist_group("together")
        def test_grouped(i):
            ran(f"grouped{{i}}")

        @pytest.mark.parametrize("i", range(16))
        def test_free(i):
            ran(f"free{{i}}")
        """)
    assert len(runs) == 22
    sleep = {v[0] for k, v in runs.items() if k.startswith("sleep")}
    others = {v[0] for k, v in runs.items() if not k.startswith("sleep")}
    assert len(sleep) == 1 and not sleep & others, runs
    assert len(others) == 2, runs  # the other two workers took everything else
    # beside them: the group's first test started before the others' last one ended
    assert min(v[1] for k, v in runs.items() if k.startswith("sleep")) < \
        max(v[2] for k, v in runs.items() if not k.startswith("sleep")), runs
