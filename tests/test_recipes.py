"""Recipes: TOML round trip, validation that names the file and the field, the CLI, warm start."""

import json
import re
import subprocess
import sys

import pytest

from autotune.hardware import fingerprint

from autotune.tuning import recipes
from autotune.commands.cli import main
from autotune import RecipeError

FP = fingerprint.Fingerprint(cpu_model="AMD EPYC", cores=2, torch_version="2.13.0",
                             script_sha256="ab" * 32, args=("--epochs", "1"))


def recipe(**over):
    d = dict(name="train-cpu2-amd-epyc", knobs={"batch_size": 64, "workers": 2,
                                                "thread_pct": 50, "instances": 1},
             samples_per_s=150.0, ci_half=3.0, baseline_samples_per_s=100.0, speedup=1.5,
             kept_baseline=False, fingerprint=FP, script_path="train.py",
             script_args=("--epochs", "1"), baseline_knobs={"batch_size": 32, "workers": 0},
             trials=9, source="dataloader", reason="it won",
             verdict={"bottleneck": "io", "text": "I/O-bound"})
    d.update(over)
    return recipes.Recipe(**d)


def test_round_trip(tmp_path):
    path = recipes.save(recipe(), tmp_path)
    assert path == tmp_path / "train-cpu2-amd-epyc.toml"
    loaded = recipes.load(path)
    assert loaded.knobs == recipe().knobs and loaded.fingerprint == FP
    assert loaded.samples_per_s == 150.0 and loaded.speedup == 1.5
    assert loaded.verdict["bottleneck"] == "io" and loaded.path == path
    assert not list(tmp_path.glob(".*tmp"))  # written atomically: no temp file left


def test_the_speed_up_interval_is_kept_and_shown(tmp_path, capsys):
    from autotune.commands import cli

    path = recipes.save(recipe(speedup_low=1.31, speedup_high=1.72), tmp_path)
    loaded = recipes.load(path)
    assert (loaded.speedup_low, loaded.speedup_high) == (1.31, 1.72)
    assert recipes.load(recipes.save(recipe(name="old"), tmp_path)).speedup_low is None
    assert cli.main(["recipes", "show", str(path)]) == 0
    assert "1.500x (1.310x-1.720x)" in capsys.readouterr().out


def test_the_winner_s_breakdown_is_kept_and_shown(tmp_path, capsys):
    from autotune.commands import cli

    shares = {"data": (0.31, 0.02), "forward": (0.4, 0.03), "backward": (0.2, 0.01),
              "comm": (0.0, 0.0), "optimizer": (0.04, 0.0), "other": (0.05, 0.01)}
    path = recipes.save(recipe(breakdown=shares), tmp_path)
    assert recipes.load(path).breakdown == shares
    assert recipes.load(recipes.save(recipe(name="old"), tmp_path)).breakdown is None
    assert cli.main(["recipes", "show", str(path)]) == 0
    assert "time goes: data wait 31% ±2, forward 40% ±3" in capsys.readouterr().out


def test_run_knobs_turn_the_share_into_threads():
    knobs, instances = recipe().run_knobs(cores=8)
    assert knobs == {"batch_size": 64, "workers": 2, "threads": 4, "instances": 1}
    assert instances == 1


def test_a_global_batch_is_kept_over_the_run_s_world(tmp_path):
    """Tuned with --global-batch 128 on one host as 2 ranks of 64: two hosts give 32 per rank,
    and a world that does not divide it is an error naming the recipe, before anything runs."""
    r = recipe(knobs={"batch_size": 64, "thread_pct": 50, "instances": 2}, global_batch=128)
    loaded = recipes.load(recipes.save(r, tmp_path))
    assert loaded.global_batch == 128 and "[job]" in loaded.path.read_text()
    assert loaded.run_knobs(8)[0]["batch_size"] == 64  # the world it was tuned on
    assert loaded.run_knobs(8, hosts=1) == ({"batch_size": 64, "threads": 4, "instances": 2}, 2)
    assert loaded.run_knobs(8, hosts=2)[0]["batch_size"] == 32
    with pytest.raises(RecipeError) as e:
        loaded.run_knobs(8, hosts=3)
    assert str(loaded.path) in str(e.value)
    assert "global batch of 128 does not divide over this run's 6 ranks" in str(e.value)
    # without a global batch the per-rank batch is the recipe's, whatever the world
    assert recipe().run_knobs(8, hosts=3)[0]["batch_size"] == 64
    assert "[job]" not in recipes.save(recipe(), tmp_path / "plain").read_text()


def test_a_gpu_recipe_s_global_batch_counts_every_gpu():
    gpu = fingerprint.Fingerprint(cpu_model="x", cores=16, gpu_names=("NVIDIA H100",) * 2,
                                  gpu_count=2)
    r = recipe(knobs={"batch_size": 32, "thread_pct": 50, "instances": 2}, fingerprint=gpu,
               global_batch=128)  # 2 MPS clients x 2 GPUs
    assert r.run_knobs(16, hosts=1)[0]["batch_size"] == 32
    assert r.run_knobs(16, gpus=4, hosts=1)[0]["batch_size"] == 16
    assert r.run_knobs(16, gpus=2, hosts=2)[0]["batch_size"] == 16


def test_name_from_script_and_hardware():
    assert recipes.recipe_name("path/to/train.py", FP) == "train-cpu2-amd-epyc"
    gpu = fingerprint.Fingerprint(cpu_model="x", cores=64, gpu_names=("NVIDIA A100-SXM4-40GB",),
                                  gpu_count=4)
    assert recipes.recipe_name("main.py", gpu) == "main-4xnvidia-a100-sxm4-40gb"


def write(tmp_path, text):
    path = tmp_path / "r.toml"
    path.write_text(text)
    return path


def good_text(tmp_path):
    return recipes.save(recipe(), tmp_path).read_text()


@pytest.mark.parametrize("edit, words", [
    (lambda t: t.replace("[knobs]", "[knobs"), ["not valid TOML"]),
    (lambda t: t.replace("samples_per_s = 150.0\n", ""), ["missing field 'result.samples_per_s'"]),
    (lambda t: t.replace("schema_version = 1", "schema_version = 7"),
     ["unknown schema_version 7"]),
    (lambda t: t.replace("cores = 2", 'cores = "two"'), ["field 'fingerprint.cores' must be int"]),
    (lambda t: t.replace("kept_baseline = false", "kept_baseline = 0"),
     ["field 'result.kept_baseline' must be bool"]),
    (lambda t: t.replace("workers = 2\n", "wrokers = 2\n", 1), ["unknown knob 'knobs.wrokers'"]),
    (lambda t: t.replace("[fingerprint]", "[fingerprints]"), ["missing table [fingerprint]"]),
    (lambda t: t + "\n[job]\nglobal_batch = 0\n", ["field 'job.global_batch' must be a whole"]),
    (lambda t: t + '\n[job]\nglobal_batch = "256"\n', ["'job.global_batch'", "'256'"]),
    (lambda t: t.replace("name = ", "job = 3\nname = ", 1), ["[job] must be a table"]),
    (lambda t: t + "\n[breakdown]\ndata = 0.3\n", ["field 'breakdown.data' must be a [share"]),
    (lambda t: t.replace("[tuned_on]\nnodes = 1", "[tuned_on]\nnodes = 0"),
     ["field 'tuned_on.nodes' must be a whole number >= 1"]),
])
def test_validation_names_file_and_field(tmp_path, edit, words):
    path = write(tmp_path, edit(good_text(tmp_path / "src")))
    with pytest.raises(RecipeError) as e:
        recipes.load(path)
    assert str(path) in str(e.value)
    for w in words:
        assert w in str(e.value)
    assert e.value.exit_code == 2


def test_not_utf8_and_missing(tmp_path):
    path = tmp_path / "bin.toml"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(RecipeError, match="not valid TOML"):
        recipes.load(path)
    with pytest.raises(RecipeError, match="not found"):
        recipes.load(tmp_path / "none.toml")


def test_cli_corrupt_recipe_is_one_line_exit_2(tmp_path):
    path = write(tmp_path, "schema_version = [")
    proc = subprocess.run([sys.executable, "-m", "autotune", "recipes", "show", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ERROR: recipe ") and str(path) in lines[0]
    assert "Traceback" not in proc.stderr


def test_cli_list_show_diff(tmp_path, capsys):
    recipes.save(recipe(), tmp_path)
    recipes.save(recipe(name="other", knobs={"batch_size": 32, "workers": 1}), tmp_path)
    write(tmp_path, "not toml [")  # listed as invalid, never fatal
    assert main(["recipes", "--recipe-dir", str(tmp_path), "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {d.get("name") for d in listed} == {"train-cpu2-amd-epyc", "other", None}
    assert any("not valid TOML" in d.get("error", "") for d in listed)
    assert main(["recipes", "list", "--recipe-dir", str(tmp_path), "--plain"]) == 0
    out = capsys.readouterr().out
    assert "INVALID" in out and "train-cpu2-amd-epyc" in out
    assert main(["recipes", "--recipe-dir", str(tmp_path), "show", "other"]) == 0
    assert "batch_size=32 workers=1" in capsys.readouterr().out
    assert main(["recipes", "--recipe-dir", str(tmp_path), "--json", "diff",
                 "train-cpu2-amd-epyc", "other"]) == 0
    rows = {r["field"]: (r["a"], r["b"]) for r in json.loads(capsys.readouterr().out)}
    assert rows["knobs.batch_size"] == (64, 32) and rows["knobs.thread_pct"] == (50, None)
    assert "fingerprint.cores" not in rows


def test_warm_start_needs_a_matching_fingerprint(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    here = fingerprint.current([str(script), "--epochs", "3"])
    saved = recipe(name=recipes.recipe_name(str(script), here), fingerprint=here)
    recipes.save(saved, tmp_path / "recipes")
    found, note = recipes.warm_start_candidate(tmp_path / "recipes", (str(script), "--x"), here)
    assert found is not None and found.knobs == saved.knobs and "warm start" in note
    script.write_text("print('changed')\n")  # the script changed: its recipe no longer applies
    changed = fingerprint.current([str(script)])
    found, note = recipes.warm_start_candidate(tmp_path / "recipes", (str(script),), changed)
    assert found is None and "script_sha256" in note


def test_a_changed_global_batch_is_told_with_its_ratio_and_the_learning_rate_rule(tmp_path,
                                                                                    capsys):
    from autotune.commands import cli
    from autotune.tuning import space

    note = space.batch_change_note({"batch_size": 32, "instances": 1},
                                   {"batch_size": 128, "instances": 2})
    assert "global batch of 256 (batch_size 128 x 2 ranks), 8x the script's own 32" in note
    assert "8x by the linear rule" in note and "2.83x by the square-root rule" in note
    assert "--global-batch 32" in note
    assert space.batch_change_note({"batch_size": 64}, {"batch_size": 32, "instances": 2}) == ""
    assert "0.5x the script's own 64" in space.batch_change_note({"batch_size": 64},
                                                                  {"batch_size": 32})
    # eight GPUs at the script's own batch: the same job, nothing to tell
    assert space.batch_change_note({"batch_size": 32}, {"batch_size": 32}, devices=8) == ""
    assert "(batch_size 64 x 8 ranks), 2x" in space.batch_change_note(
        {"batch_size": 32}, {"batch_size": 64}, devices=8)
    path = recipes.save(recipe(batch_note=note), tmp_path)
    assert recipes.load(path).batch_note == note
    assert cli.main(["recipes", "show", str(path)]) == 0
    assert "batch:     the winner trains with a global batch of 256" in capsys.readouterr().out


def test_the_objective_and_its_parts_are_kept_and_shown(tmp_path, capsys):
    from autotune.commands import cli

    parts = {"note": "goodput: B_noise 812 (over 40 steps), fixed for the search",
             "score": 120.5, "efficiency": 0.8, "noise_scale": 812.0, "j_per_sample": 0.05,
             "samples_per_j": 20.0, "baseline_j_per_sample": 0.07,
             "front": ["* batch_size=64: 150.0 samples/s, 20 samples/J",
                       "  batch_size=128: 180.0 samples/s, 12 samples/J"]}
    path = recipes.save(recipe(objective="throughput,energy", objective_parts=parts), tmp_path)
    loaded = recipes.load(path)
    assert loaded.objective == "throughput,energy" and loaded.objective_parts == parts
    assert cli.main(["recipes", "show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "objective: throughput,energy: efficiency 0.800 of the script's batch (B_noise 812)" \
        in out and "0.05 J/sample (baseline 0.07)" in out
    assert "Pareto front (* the pick):" in out and "* batch_size=64" in out
    assert "gain:      1.500x" in out
    # a recipe from before objectives: tuned for throughput, shown as ever
    old = recipes.load(recipes.save(recipe(name="old"), tmp_path))
    assert old.objective == "throughput" and old.objective_parts is None
    assert "[objective]" not in (tmp_path / "old.toml").read_text()
    assert cli.main(["recipes", "show", str(tmp_path / "old.toml")]) == 0
    out = capsys.readouterr().out
    assert "objective:" not in out and "speedup:   1.500x" in out


@pytest.mark.parametrize("edit, words", [
    (lambda t: t + '\n[objective]\nname = "energy"\nj_per_sample = "0.1"\n',
     ["field 'objective.j_per_sample' must be int or float", "'0.1'"]),
    (lambda t: t + "\n[objective]\nname = 3\n", ["field 'objective.name' must be one of "
                                                  "throughput, goodput, energy"]),
    (lambda t: t + '\n[objective]\nname = "watts"\n', ["'objective.name'", "'watts'"]),
    (lambda t: t + '\n[objective]\nfront = "a"\n', ["field 'objective.front' must be list"]),
])
def test_a_bad_objective_table_names_the_field(tmp_path, edit, words):
    path = write(tmp_path, edit(good_text(tmp_path / "src")))
    with pytest.raises(RecipeError) as e:
        recipes.load(path)
    for w in words:
        assert w in str(e.value)


def test_keep_batch_of_a_recipe_without_an_alternative(tmp_path):
    """``run --keep-batch``: a recipe whose knobs keep the batch runs them; one whose knobs
    change it and that holds no [keep_batch] (an older autotune's) is a RecipeError, exit 2."""
    from autotune.commands import run as run_command
    from autotune.tuning.decision import Choice

    same = recipes.load(recipes.save(recipe(), tmp_path))
    assert same.keep_batch is None and run_command.chosen(same, keep_batch=True) is same
    old = recipes.load(recipes.save(recipe(batch_note="the winner trains with a global batch "
                                                      "of 64"), tmp_path))
    with pytest.raises(RecipeError, match=r"no \[keep_batch\] config") as err:
        run_command.chosen(old, keep_batch=True)
    assert err.value.exit_code == 2
    keep = Choice({"batch_size": 32, "workers": 2}, 130.0, 2.0, 1.3, 1.1, 1.5, False, "kept")
    both = recipes.load(recipes.save(recipe(keep_batch=keep), tmp_path))
    assert both.keep_batch == keep
    assert dict(run_command.chosen(both, keep_batch=True).knobs) == dict(keep.knobs)


def test_a_spoiled_keep_batch_table_names_its_field(tmp_path):
    from autotune.tuning.decision import Choice

    path = recipes.save(recipe(keep_batch=Choice({"batch_size": 48}, 1.0, 0.1)), tmp_path)
    path.write_text(path.read_text().replace("batch_size = 48", "nonsense = 48"))
    with pytest.raises(RecipeError, match=r"keep_batch\.knobs"):
        recipes.load(path)


def test_the_nodes_and_link_it_was_tuned_on_are_kept_and_shown(tmp_path, capsys):
    """[tuned_on]: the nodes the tune's ranks spanned and the allreduce's figure for the link;
    a recipe saved before the table reads as one node, link unknown."""
    from autotune.commands import cli
    from autotune.measuring import allreduce
    from autotune.tuning.records import AllreduceTiming, TunedOn

    timing = AllreduceTiming(allreduce.AllreduceResult("gloo", 2, "cpu", (
        allreduce.Point(2**20, 0.01, 0.1, 0.1), allreduce.Point(2**24, 0.2, 0.0839, 0.0839))))
    on = TunedOn.of(2, timing)
    assert on.busbw_gbps == 0.1 and "across 2 nodes" in on.link and "0.1 GB/s" in on.link
    assert TunedOn.of(1, None) == TunedOn(nodes=1)
    path = recipes.save(recipe(tuned_on=on), tmp_path)
    assert recipes.load(path).tuned_on == on
    assert cli.main(["recipes", "show", str(path)]) == 0
    assert f"tuned on:  2 node(s), {on.link}" in capsys.readouterr().out
    old = re.sub(r"\[tuned_on\]\n(?:[^\[\n][^\n]*\n?)*", "", path.read_text())
    assert "tuned_on" not in old and "[fingerprint]" in old
    assert recipes.load(write(tmp_path, old)).tuned_on == TunedOn(nodes=1)


def test_a_run_on_another_number_of_nodes_flags_the_bucket_and_the_global_batch():
    """Tuned on 2 nodes over a measured link: a run on 1 node carries instances and threads
    over and says the job's global batch halves and the bucket was tuned for that link; the same
    number of nodes says nothing; a recipe keeping a global batch does not flag the batch."""
    from autotune.commands.run import node_change
    from autotune.tuning.records import TunedOn

    on = TunedOn(nodes=2, busbw_gbps=0.1, link="gloo allreduce of 2 ranks across 2 nodes")
    r = recipe(knobs={"batch_size": 64, "thread_pct": 100, "instances": 1, "bucket_mb": 4},
               tuned_on=on)
    knobs, instances = r.run_knobs(cores=1, hosts=1)
    lines = node_change(r, knobs, instances, hosts=1, gpus=0)
    assert len(lines) == 3, lines
    assert "tuned on 2 node(s) (gloo allreduce of 2 ranks across 2 nodes); this run has 1" \
        in lines[0] and "instances=1" in lines[0] and "threads=1" in lines[0]
    assert "global batch goes from 128 (as tuned) to 64" in lines[1]
    assert "--global-batch 128" in lines[1]
    assert "bucket_mb=4 was tuned for gloo allreduce of 2 ranks across 2 nodes" in lines[2]
    assert node_change(r, *r.run_knobs(cores=1, hosts=2), hosts=2, gpus=0) == []
    kept = recipe(knobs={"batch_size": 64, "instances": 1}, global_batch=128, tuned_on=on)
    lines = node_change(kept, *kept.run_knobs(cores=1, hosts=1), hosts=1, gpus=0)
    assert len(lines) == 1 and "bucket" not in lines[0], lines
    # a recipe that never measured its link says so
    plain = recipe(knobs={"batch_size": 8, "bucket_mb": 25})
    lines = node_change(plain, *plain.run_knobs(cores=2, hosts=2), hosts=2, gpus=0)
    assert "tuned on 1 node(s) (the link between its ranks not measured)" in lines[0]
    assert "from 8 (as tuned) to 16" in lines[1]
