"""The suite's own scheduling: tests of one xdist group run on one worker, one after another.

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


def test_an_xdist_group_runs_on_one_worker_under_the_suites_own_options(tmp_path):
    pytest.importorskip("xdist")
    record = tmp_path / "ran"
    record.mkdir()
    (tmp_path / "test_grouped.py").write_text(textwrap.dedent(f"""
        import json, os, time
        import pytest

        def ran(name):
            path = os.path.join({str(record)!r}, name)
            with open(path, "w") as f:
                json.dump([os.environ["PYTEST_XDIST_WORKER"]], f)
            time.sleep(0.3)

        @pytest.mark.parametrize("i", range(6))
        @pytest.mark.xdist_group("together")
        def test_grouped(i):
            ran(f"grouped{{i}}")

        @pytest.mark.parametrize("i", range(6))
        def test_free(i):
            ran(f"free{{i}}")
        """))
    # the suite's configuration (its addopts), on this file only
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n",
                        "2", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path),
                        str(tmp_path / "test_grouped.py")],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    runs = {f.name: json.loads(f.read_text()) for f in record.iterdir()}
    assert len(runs) == 12
    grouped = {v[0] for k, v in runs.items() if k.startswith("grouped")}
    assert len(grouped) == 1, runs  # one worker (which runs one test at a time)
    # two workers did run the file: the check above means something
    assert len(grouped | {v[0] for k, v in runs.items() if k.startswith("free")}) == 2, runs


def test_the_readme_s_test_command_is_the_one_ci_runs():
    """README's second command and `.ci/run`'s are one line, word for word: the split of the
    suite into its runs (the Slurm tune with the default foreign-load guard alone, then the
    other cluster tests beside the rest) is what a user runs."""
    readme = (ROOT / "README.md").read_text().splitlines()
    at = next(i for i, line in enumerate(readme) if line.startswith("The second command"))
    shown = next(line.strip() for line in readme[at + 1:] if line.strip())
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line and not line.startswith(("#", "set ", "cd "))]
    assert ci == [shown]
    alone = " -m cluster tests/test_cluster_tune.py && "
    beside = (' -m "cluster or heavy" --ignore=tests/test_cluster_tune.py --durations=15 > '
              'tests-cluster.log 2>&1 & ')
    rest = '-m "not cluster and not heavy"'
    assert alone in shown and beside in shown and rest in shown
    assert shown.index(alone) < shown.index(beside) < shown.index(rest)
    assert shown.endswith('[ "$main" = 0 ] && [ "$cluster" = 0 ]; }')


def test_the_heavy_tunes_are_marked_heavy_so_ci_runs_them_apart_from_the_workers():
    """conftest marks every test of the `HEAVY` xdist group ``heavy`` before ``-m`` selects:
    CI's second run (``-m "cluster or heavy"``) takes exactly them, the workers' run none."""
    def collected(mark: str) -> set[str]:
        p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "--collect-only", "-m", mark, str(ROOT / "tests")],
                           capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        return {line for line in p.stdout.splitlines() if "::" in line}

    heavy = collected("heavy")
    assert heavy and all(any(f in t for f in ("test_fitted_e2e.py", "test_breakdown.py",
                                              "test_faults_recipes.py", "test_frameworks.py"))
                         for t in heavy), heavy
    assert "tests/test_frameworks.py::test_tune_and_run_an_unmodified_framework_script" \
        "[lightning_ddp]" in heavy
    assert "tests/test_fitted_e2e.py::test_a_claimed_speed_up_holds_when_the_script_measures_it" \
        in heavy
    assert not heavy & collected("not cluster and not heavy")
