"""bench/bench_parity.py's pure parts (issue 39): the three ways one config is started, the
recipe that holds exactly it, the ratios and what fails the bench. The bench itself runs real
training for minutes; it is run by hand and on the device (bench/gpu_device_call.sh)."""

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from bench import bench_parity as bp  # noqa: E402
from bench.meter_cost import meter_cost_us  # noqa: E402


def test_a_plain_start_is_what_a_user_types():
    one, two = bp._compute(1), bp._compute(2)
    assert bp.plain_argv(one, "py")[:2] == ["py", one.script[0]]
    assert "--batch-size" in one.args() and "16" in one.args()
    argv = bp.plain_argv(two, "py")
    assert argv[:5] == ["py", "-m", "torch.distributed.run", "--standalone",
                        "--nproc_per_node=2"]
    run = bp.run_argv(two, "py", Path("r.toml"), Path("runs"))
    assert run[:4] == ["py", "-m", "autotune", "run"] and "{batch_size}" in run
    assert bp.user_env({"OMP_NUM_THREADS": "4", "AUTOTUNE_RUNS_DIR": "x", "PATH": "/bin",
                        "PYTHONPATH": f"/w:{bp.ROOT}"}) == \
        {"PATH": "/bin", "PYTHONPATH": f"{bp.ROOT}:/w"}  # autotune found where not installed


def test_the_recipe_gives_the_ranks_the_threads_a_plain_start_gives(monkeypatch):
    monkeypatch.setattr(bp.os, "sched_getaffinity", lambda pid: set(range(2)))
    from autotune.tuning import space

    for ranks, threads in ((1, 2), (2, 1)):
        knobs, instances = space.rank_knobs(bp._images(ranks).recipe_knobs, cores=2,
                                            device="cpu")
        assert instances == ranks and knobs["threads"] == threads  # torchrun's one each
    # OMP_NUM_THREADS=1 written by the user: the recipe's rank gets one thread too
    one = next(c for c in bp.configs_for("cpu", threads=1) if c.name == "data-1r")
    assert space.rank_knobs(one.recipe_knobs, cores=2, device="cpu")[0]["threads"] == 1
    # Lightning starts its second rank itself: one process to autotune, and each rank gets the
    # cores split evenly by Lightning's own rule, so the recipe gives the one it starts that
    lightning = bp._lightning()
    assert lightning.ranks == 1 and bp.plain_argv(lightning, "py")[:2] == ["py",
                                                                           lightning.script[0]]
    assert space.rank_knobs(lightning.recipe_knobs, cores=2, device="cpu") == \
        ({"batch_size": 32, "workers": 0, "threads": 1, "instances": 1}, 1)
    gpu = {c.name: c for c in bp.configs_for("gpu")}
    assert [(c.ranks, c.mps, c.share) for c in gpu.values()] == \
        [(1, False, 100), (2, True, 50), (4, True, 25), (4, True, 100)]
    assert gpu["cuda-4r-mps25"].recipe_knobs["thread_pct"] == 25
    assert "gloo" in gpu["cuda-4r-mps25"].script  # NCCL refuses two ranks on one GPU


def test_the_rounds_rotate_and_the_ratios_are_per_round_medians():
    assert bp.rotations(3) == [("plain", "run", "probe"), ("run", "probe", "plain"),
                               ("probe", "plain", "run")]
    row = bp.summarise(bp._compute(1), {"plain": [100.0, 200.0, 100.0],
                                        "run": [99.0, 190.0, None], "probe": [97.0, 210.0, 90.0]})
    assert row["plain"] == 100.0 and row["run"] == pytest.approx(144.5)
    assert row["run_ratios"] == pytest.approx([0.99, 0.95])  # the round without a figure: out
    assert row["run_ratio"] == pytest.approx(0.97)
    assert row["probe_spread"] == pytest.approx([0.9, 1.05])
    assert bp.failures([row], 0.97) == []  # 0.97 itself passes
    low = bp.summarise(bp._compute(1), {"plain": [100.0], "run": [90.0], "probe": []})
    assert bp.failures([low], 0.97) == ["short-1r run: 0.900 < 0.97", "short-1r probe: no figure"]


def test_the_script_lines_are_read_not_autotunes():
    text = ("autotune: full run: 51.2 samples/s\n[rank 0] epoch 1 step 25 loss 2.3 samples/s "
            "100.0\nepoch 1 step 50 loss 2.2 samples/s 120.0\n")
    assert [float(x) for x in bp.EXAMPLE_RATE.findall(text)] == [100.0, 120.0]
    assert bp.NANOGPT_RATE.findall("iter 5: loss 2.1, time 12.0ms, 99.5 samples/s\n") == ["99.5"]


def test_the_meter_costs_a_few_microseconds_a_step():
    cost = meter_cost_us(steps=500)
    assert 0 < cost["hooks"] < 1000 and 0 < cost["clock_host"] < 1000 and cost["tick_us"] > 0


def test_every_way_s_figure_stands_on_the_same_count_of_the_script_s_lines():
    """A probe's lines run on for its whole length; a plain run's stop after the count the
    calibration took: each figure is the mean of lines 2 to count + 1, whatever came after."""
    text = "".join(f"epoch 1 step {25 * i} loss 2.0 samples/s {r}\n"
                   for i, r in enumerate([50.0, 100.0, 110.0, 90.0, 60.0, 60.0], start=1))
    assert bp.first_lines_rate(text, bp.EXAMPLE_RATE, 3) == pytest.approx(100.0)
    assert bp.first_lines_rate(text, bp.EXAMPLE_RATE, 10) == pytest.approx(84.0)
    assert bp.first_lines_rate(text.splitlines()[0], bp.EXAMPLE_RATE, 3) is None


def test_a_run_cut_to_a_span_keeps_the_lines_that_came_within_it(tmp_path):
    """The calibration's run: lines that came within the span after the first are counted,
    those after it are not, and the run is stopped."""
    script = tmp_path / "lines.py"
    script.write_text("import time\nfor i in range(40):\n"
                      "    print(f'epoch 1 step {i} loss 1.0 samples/s 10.0', flush=True)\n"
                      "    time.sleep(0.1)\n")
    ctx = bp.Ctx(work=tmp_path, seconds=20.0, env={"PATH": "/usr/bin:/bin"})
    text = bp.lines_run([sys.executable, str(script)], bp.EXAMPLE_RATE, ctx, dict(ctx.env), 3,
                        span_s=1.0)
    got = len(bp.EXAMPLE_RATE.findall(text))
    assert 6 <= got <= 14, text  # ~11 lines in the first second (one a tenth), not all 40
    # by count alone it stops at the count after the first
    text = bp.lines_run([sys.executable, str(script)], bp.EXAMPLE_RATE, ctx, dict(ctx.env), 3)
    assert 4 <= len(bp.EXAMPLE_RATE.findall(text)) < 40


def test_the_hooks_cost_in_the_loop_is_read_with_them_on_and_off_in_turns():
    """One turn of each way in its own process: the meter counted every sample of the `on`
    blocks (16 a step) and none of the `off` ones or of the wrappers that only pass through,
    so the ways really switch the hooks."""
    from bench import hook_cost

    got = hook_cost.in_own_process(blocks=1, timeout_s=300.0)
    assert "error" not in got, got
    steps = got["steps_per_block"]
    assert steps == 4096 // 16 and got["blocks"] == 1
    assert got["on"]["samples"] == got["no-clock"]["samples"] == 16 * steps
    assert got["off"]["samples"] == got["pass-through"]["samples"] == 0
    assert all(got[w]["us_per_step"] > 0 for w in hook_cost.WAYS)
    assert got["off"]["over_off_us"] == 0.0


def test_pooled_rounds_give_the_median_a_sign_test_interval():
    from bench import parity_pool as pp

    # 9 values: the sign test's 95% interval is the 2nd and 8th smallest (coverage 0.961)
    lo, hi, cover = pp.median_interval([0.9, 1.0, 0.95, 0.97, 0.99, 1.02, 0.93, 0.96, 1.05])
    assert (lo, hi) == (0.93, 1.02) and cover == pytest.approx(1 - 2 * 10 / 512)
    # too few for 95%: the min and max, and what they cover (1 - 2/2**5)
    assert pp.median_interval([3.0, 1.0, 2.0, 5.0, 4.0]) == (1.0, 5.0, pytest.approx(0.9375))
    reports = [{"configs": [{"config": "short-1r", "run_ratios": [0.9, 1.0],
                             "probe_ratios": [0.8]}]},
               {"configs": [{"config": "short-1r", "run_ratios": [1.1], "probe_ratios": []},
                            {"config": "short-2r", "run_ratios": [], "probe_ratios": [0.95]}]}]
    rows = pp.pooled(reports)
    assert [r["config"] for r in rows] == ["short-1r", "short-2r"]
    assert rows[0]["run"]["rounds"] == 3 and rows[0]["run"]["median"] == pytest.approx(1.0)
    assert rows[0]["probe"]["median"] == 0.8 and rows[1]["run"] is None
    assert "0.950 (0.950-0.950, 1 rounds)" in pp.table(rows)
    extra = pp.pooled([{"configs": [{"config": "short-2r", "run_ratios": [1.0],
                                     "probe_ratios": [0.9], "probe-ddp-own_ratios": [0.99]}]}])
    assert extra[0]["probe-ddp-own"]["median"] == 0.99
    assert "probe-ddp-own/plain" in pp.table(extra)


def test_the_comm_hook_bench_prices_a_probe_s_ddp_and_a_python_hook_against_ddp_s_own(capsys):
    from bench import comm_hook_cost

    assert comm_hook_cost.main(["--blocks", "2", "--steps", "5"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # a probe's copy on the CPU keeps DDP's C++ allreduce, as the script's own does; the third
    # runs the Python allreduce a hook of ours would; all three are timed by DDP itself
    assert out["comm_hooks"] == {"ddp-own": "", "probe": "", "python-hook": "allreduce_hook"}
    assert out["timed_by_ddp"] == 3 and out["exposed_comm_s"] >= 0.0
    assert out["ddp-own"]["over_ddp_own_us"] == 0.0
    for way in ("probe", "python-hook"):
        assert out[way]["us_per_step"] > 0 and out[way]["cpu_us_per_step"] > 0


def test_a_run_s_foreign_load_is_the_machine_s_cpu_less_its_own_processes():
    # 10 s: the machine's programs took 25 CPU s, the bench and its waited-for runs 20 of
    # them; the hypervisor held a core for 1 s of the 10
    load = bp.load_between((100.0, 1000.0, 5.0, 50.0), (110.0, 1025.0, 6.0, 70.0))
    assert load == {"others": 0.5, "steal": 0.1}
    # the bench's own count may run ahead of the kernel's ticks: never below nothing
    assert bp.load_between((0.0, 0.0, 0.0, 0.0), (1.0, 1.0, 0.0, 1.5))["others"] == 0.0
    row = bp.summarise(bp._compute(1), {"plain": [100.0], "run": [99.0], "probe": [98.0]},
                       {"plain": [load], "run": [], "probe": []})
    assert row["load"]["plain"] == [{"others": 0.5, "steal": 0.1}] and row["load"]["run"] == []
    # this process's own work is not foreign: its count grows with it (in clock ticks of
    # 10 ms, which one fixed bit of work on a fast machine may not cross)
    import time

    before, deadline = bp._cpu_now(), time.monotonic() + 10.0
    while bp._cpu_now()[3] <= before[3] and time.monotonic() < deadline:
        sum(i * i for i in range(200_000))
    assert bp._cpu_now()[3] > before[3]


def test_an_extra_way_is_rotated_measured_and_reported_but_not_judged():
    ways = (*bp.WAYS, "probe-ddp-own")
    assert bp.rotations(2, ways) == [ways, ("run", "probe", "probe-ddp-own", "plain")]
    row = bp.summarise(bp._compute(2), {"plain": [100.0, 100.0], "run": [99.0, 98.0],
                                        "probe": [98.0, 97.0], "probe-ddp-own": [80.0, 90.0]})
    assert row["probe-ddp-own_ratio"] == pytest.approx(0.85)
    assert row["probe-ddp-own_spread"] == pytest.approx([0.8, 0.9])
    assert bp.failures([row], 0.97) == []  # its 0.85 does not fail the bench
    assert "probe-ddp-own: 85.0 samples/s, 0.850 (0.80-0.90) of plain" in bp.table([row])
    assert "probe-ddp-own" not in bp.summarise(bp._compute(1), {"plain": [1.0]})["rounds"]
    assert set(bp.EXTRA_WAYS) == {"probe-ddp-own", "probe-no-watch", "plain-log",
                                  "run-controller-held"}
    assert set(bp.EXTRA_WAYS) - set(bp.TURNS_ONLY) <= set(bp.RUNNERS)


def test_in_turns_each_way_is_one_command_and_autotunes_are_read_from_rank_0_s_log(tmp_path):
    """A round in turns (`bench.turns.take_turns_of`): the plain start as the user types it,
    its lines on its own output; ``autotune run`` in a runs folder of its own, read from the
    `fullrun.log` under it; the probe held to its limit (its floor there), read from its rank 0
    log; a probe-no-watch asks for no write watch."""
    ctx = bp.Ctx(work=tmp_path, seconds=60.0, env={"PATH": "/bin"})
    two = bp._compute(2)
    ctx.recipes[two.name] = tmp_path / "r.toml"
    plain = bp.turn_start("plain", two, ctx, 1)
    assert list(plain.argv) == bp.plain_argv(two, sys.executable) and plain.log is None
    run = bp.turn_start("run", two, ctx, 1)
    runs = Path(run.argv[run.argv.index("--runs-dir") + 1])
    assert runs.parent == tmp_path and run.log == runs / "*" / "logs" / "fullrun.log"
    probe = bp.turn_start("probe", two, ctx, 1)
    spec = json.loads(probe.argv[probe.argv.index("--probe-one") + 1])
    assert probe.log == Path(spec["log_dir"]) / "parity-short-2r.log"
    assert spec["fixed_dir"] and spec["min_s"] == spec["seconds"] >= 3 * ctx.seconds
    assert not spec["no_watch"] and bp.turn_start("probe-no-watch", two, ctx, 1).argv != \
        probe.argv
    assert json.loads(bp.turn_start("probe-no-watch", two, ctx, 2).argv[-1])["no_watch"]
    assert len({run.log.parent.parent, Path(spec["log_dir"])}) == 2  # a folder each
    held = bp.turn_start("run-controller-held", two, ctx, 1)
    assert held.root_held and not run.root_held and held.argv[:4] == run.argv[:4]


def test_plain_log_is_the_plain_start_with_rank_0_s_lines_read_from_torchrun_s_file(tmp_path):
    """The extra way ``plain-log``: the user's torchrun command, each rank's output redirected
    to a file by torchrun itself, and the pattern it is read from matches the file torchrun
    writes for rank 0 (a real torchrun of two ranks of a script that prints one rate line)."""
    script = tmp_path / "say.py"
    script.write_text("import os\nprint(f'epoch 1 step {os.environ[\"RANK\"]} loss 1.0 "
                      "samples/s 5.0', flush=True)\n")
    c = bp.Config("say-2r", "one line", (str(script),), (), {}, ranks=2)
    ctx = bp.Ctx(work=tmp_path, seconds=60.0, env={**os.environ, "OMP_NUM_THREADS": "1"})
    start = bp.turn_start("plain-log", c, ctx, 1)
    argv = list(start.argv)
    assert argv[:5] == bp.plain_argv(c, sys.executable)[:5] and argv[-1] == str(script)
    assert argv[argv.index("--redirects") + 1] == "1"
    done = subprocess.run(argv, env=start.env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "samples/s" not in done.stdout  # the ranks' lines went to their files
    found = glob.glob(str(start.log))
    assert len(found) == 1
    assert bp.EXAMPLE_RATE.findall(Path(found[0]).read_text()) == ["5.0"]
    assert "step 0 " in Path(found[0]).read_text()  # rank 0's file
    with pytest.raises(SystemExit):
        bp.main(["--extra-ways", "plain-log", "--one-after-another", "--rounds", "1"])


def _cmdline(p) -> str:
    import psutil

    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def _running(p) -> bool:
    import psutil

    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_sigterm_ends_the_bench_through_its_cleanup_and_leaves_no_process(tmp_path):
    """A bench started in the background of a shell ignores SIGINT, so SIGTERM is how it is
    stopped: it ends with 143 after stopping every way it started (held ones too), none of
    whose processes outlives it."""
    import signal
    import time

    import psutil

    out = tmp_path / "parity.json"
    bench = subprocess.Popen(
        [sys.executable, str(bp.ROOT / "bench" / "bench_parity.py"), "--configs", "short-1r",
         "--rounds", "1", "--no-meter", "--turn-seconds", "60", "--out", str(out)],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True)
    try:
        me = psutil.Process(bench.pid)
        deadline = time.monotonic() + 240
        tree: list = []
        while time.monotonic() < deadline and bench.poll() is None:
            tree = me.children(recursive=True)
            if any("probes.boot" in _cmdline(p) for p in tree):  # the rounds began: a way of autotune's runs
                break
            time.sleep(0.2)
        assert bench.poll() is None and tree, bench.stderr.read() if bench.poll() else tree
        tree = me.children(recursive=True)
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=120) == 128 + signal.SIGTERM
        _, alive = psutil.wait_procs(tree, timeout=15)
        running = [p for p in alive if _running(p)]  # a zombie a subreaper holds runs nothing
        assert not running, running
    finally:
        if bench.poll() is None:
            os.killpg(bench.pid, signal.SIGKILL)
            bench.wait()
