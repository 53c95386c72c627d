"""Fault matrix, recipes: a wrongly typed field, required or optional, at any level, is one
`ERROR:` line naming the file and the field (exit 2) in `run --recipe` and `recipes show`; `recipes
list` lists the good ones and warns once per bad file; warm start skips a bad recipe with a note."""

import os
import re

import pytest

from autotune.hardware import fingerprint

from autotune.tuning import recipes
from conftest import HEAVY, SCRIPTS, assert_one_error_line, autotune

FP = fingerprint.Fingerprint(cpu_model="AMD EPYC", cores=2, torch_version="2.13.0",
                             script_sha256="ab" * 32, args=())

# (what to replace in a good recipe's TOML, by what) -> the field the error must name
BAD = [
    ("trials = 9", 'trials = "x"', "result.trials"),
    ("baseline_ci_half = 1.0", 'baseline_ci_half = "x"', "result.baseline_ci_half"),
    ('source = "dataloader"', "source = 3", "result.source"),
    ('gpu_driver = ""', "gpu_driver = 1", "fingerprint.gpu_driver"),
    ('created = "2026-11-21T23:59:00Z"', "created = 2026", "created"),
    ('text = "I/O-bound"', "text = 3", "verdict.text"),
    ("[baseline]\nbatch_size = 32", '[baseline]\nbatch_size = "x"', "baseline.batch_size"),
    ('gpu_names = []', 'gpu_names = [1]', "fingerprint.gpu_names"),
]


def good(name="ok-recipe", fp=FP) -> recipes.Recipe:
    return recipes.Recipe(
        name=name, knobs={"batch_size": 16, "workers": 0}, samples_per_s=150.0, ci_half=3.0,
        baseline_samples_per_s=100.0, baseline_ci_half=1.0, speedup=1.5, kept_baseline=False,
        fingerprint=fp, script_path="ok.py", baseline_knobs={"batch_size": 32}, trials=9,
        source="dataloader", reason="it won", created="2026-11-21T23:59:00Z",
        verdict={"bottleneck": "io", "text": "I/O-bound"})


def spoil(path, old, new):
    text = path.read_text()
    assert old in text, text
    path.write_text(text.replace(old, new, 1))


@pytest.mark.parametrize("old,new,field", BAD, ids=[b[2] for b in BAD])
def test_a_wrongly_typed_field_is_named(tmp_path, old, new, field):
    path = recipes.save(good(), tmp_path)
    spoil(path, old, new)
    with pytest.raises(recipes.RecipeError) as e:
        recipes.load(path)
    assert str(path) in str(e.value) and f"'{field}'" in str(e.value)


@pytest.mark.parametrize("old,new,field", BAD[:2], ids=[b[2] for b in BAD[:2]])
def test_cli_show_and_run_say_one_line(tmp_path, old, new, field):
    path = recipes.save(good(), tmp_path)
    spoil(path, old, new)
    assert_one_error_line(autotune("recipes", "show", str(path), cwd=tmp_path), str(path), field)
    assert_one_error_line(autotune("run", "--recipe", str(path), "--", str(SCRIPTS / "ok.py"),
                                   cwd=tmp_path), str(path), field)


def test_list_shows_the_good_and_warns_once_per_bad_file(tmp_path):
    recipes.save(good(), tmp_path)
    for i, (old, new, _) in enumerate(BAD[:2]):
        spoil(recipes.save(good(name=f"bad{i}"), tmp_path), old, new)
    p = autotune("recipes", "list", "--recipe-dir", str(tmp_path), "--plain", cwd=tmp_path)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    assert "ok-recipe" in p.stdout and "150.0" in p.stdout
    warnings = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(warnings) == 2 and all(w.startswith("WARNING: recipe ") for w in warnings)
    assert "bad0.toml" in warnings[0] and "'result.trials'" in warnings[0]
    assert "bad1.toml" in warnings[1] and "'result.baseline_ci_half'" in warnings[1]


def test_warm_start_skips_a_bad_recipe(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    here = fingerprint.current([str(script)])
    path = recipes.save(good(name=recipes.recipe_name(str(script), here), fp=here),
                        tmp_path / "recipes")
    spoil(path, "trials = 9", 'trials = "x"')
    found, note = recipes.warm_start_candidate(tmp_path / "recipes", (str(script),), here)
    assert found is None and "not warm-starting" in note and "'result.trials'" in note


# instances held: the two-rank probe (two tries of ~5 s at this length) is not what this is
# about, and each tune here ran it. Probes of 8 s: CI runs these tunes beside three workers of
# other tests on two cores, where a start took 19 s and probes of 4, 8 and 16 s gave nothing.
WARM_TUNE = ("tune", "--plain", "--trials", "2", "--seconds", "8", "--confirm-rounds", "0",
             "--foreign-limit", "1000", "--fix", "threads=1", "instances=1", "--",
             str(SCRIPTS / "tune_toy.py"), "--work", "1")


@pytest.fixture(scope="module")
def first_tune_recipe(tmp_path_factory):
    """The recipe the first tune saved in its ./recipes: one tune for both cases below, which
    only read it (each tunes again beside its own copy)."""
    here = tmp_path_factory.mktemp("first-tune")
    first = autotune(*WARM_TUNE, cwd=here, env=dict(os.environ,
                                                    AUTOTUNE_RUNS_DIR=str(here / "runs")),
                     timeout=240)
    assert first.returncode == 0, first.stderr[-3000:]
    saved, = (here / "recipes").glob("*.toml")
    return saved


@pytest.mark.slow
@pytest.mark.xdist_group(HEAVY)
@pytest.mark.parametrize("spoiled", [False, True])
def test_a_second_tune_warm_starts_from_the_first_or_says_why_not(tmp_path, spoiled,
                                                                 first_tune_recipe):
    """The recipe a tune saved in ./recipes is found by the next tune of the same script: news
    when it warm-starts, a WARNING naming the field when it cannot be used; the tune goes on.
    The second tune runs where the first one's recipe lies, copied (spoiled or not)."""
    (tmp_path / "recipes").mkdir()
    saved = tmp_path / "recipes" / first_tune_recipe.name
    text = first_tune_recipe.read_text()
    if spoiled:
        text = re.sub(r"^trials = \d+$", 'trials = "x"', text, flags=re.M)
        assert 'trials = "x"' in text
    saved.write_text(text)
    second = autotune(*WARM_TUNE, cwd=tmp_path, timeout=240)
    assert second.returncode == 0, second.stderr[-3000:]
    if spoiled:
        assert "WARNING: " in second.stderr and "not warm-starting" in second.stderr
    else:
        assert "warm start" in second.stderr and "WARNING: recipe" not in second.stderr
