"""Knob flags in the script's own arguments, in the spellings real scripts use."""

import pytest

from autotune.launching.script_flags import explicit_knobs, split_knobs


def found(*args):
    return {k: e.value for k, e in explicit_knobs(list(args)).items()}


@pytest.mark.parametrize("args, expected", [
    (["-b", "32", "-j", "4"], {"batch_size": "32", "workers": "4"}),
    (["-b32", "-j4"], {"batch_size": "32", "workers": "4"}),
    (["-b=32"], {"batch_size": "32"}),
    (["--batch-size", "32"], {"batch_size": "32"}),
    (["--batch_size=32"], {"batch_size": "32"}),
    (["--batchSize", "32"], {"batch_size": "32"}),
    (["--bs", "32"], {"batch_size": "32"}),
    (["-bs", "32"], {"batch_size": "32"}),
    (["--per_device_train_batch_size", "8", "--dataloader_num_workers", "2"],
     {"batch_size": "8", "workers": "2"}),
    (["--trainer.batch_size=32", "--trainer.num_workers=4"], {"batch_size": "32", "workers": "4"}),
    (["--data.loader.num-workers", "3"], {"workers": "3"}),
    (["trainer.batch_size=12", "+data.num_workers=2"], {"batch_size": "12", "workers": "2"}),
    (["batch_size=12"], {"batch_size": "12"}),
    (["--workers", "4"], {"workers": "4"}),
    (["--num-workers", "4"], {"workers": "4"}),
    (["--num_workers", "4"], {"workers": "4"}),
    (["--numWorkers=4"], {"workers": "4"}),
])
def test_spellings(args, expected):
    assert found(*args) == expected


@pytest.mark.parametrize("args", [
    ["--eval-batch-size", "64"], ["--global_batch_size=512"], ["--val_batch_size", "8"],
    ["--lr", "0.1"], ["--model.b=3"], ["b=3"], ["--batch-size"], ["--batch-size", "--lr", "1"],
    ["-j"], ["--", "--batch-size", "32"], ["--jobs", "4"], ["-w", "4"],
])
def test_not_knob_flags(args):
    assert found(*args) == {}


def test_placeholders_are_not_explicit():
    assert found("--batch-size", "{batch_size}", "-j", "{workers}") == {}
    assert found("--batch_size={batch_size}") == {}
    assert found("-b", "{batch_size}", "-j", "2") == {"workers": "2"}


def test_last_occurrence_wins_like_argparse():
    assert found("--bs", "8", "--batch-size", "16") == {"batch_size": "16"}
    assert found("--bs", "8", "--bs", "{batch_size}") == {}


def test_value_that_looks_like_a_negative_number():
    assert found("-j", "-1") == {"workers": "-1"}
    assert found("--lr", "-1", "-b", "4") == {"batch_size": "4"}


def test_python_and_module_arguments_are_skipped():
    assert found("-m", "pkg.train", "-u", "--batch-size", "32") == {"batch_size": "32"}


def test_suggestion_keeps_the_users_spelling():
    args = ["--lr", "0.1", "--trainer.batch_size=32", "-j", "4", "-b16"]
    ex = explicit_knobs(args)
    assert ex["batch_size"].typed == "-b16" and ex["batch_size"].suggestion == "-b{batch_size}"
    assert ex["workers"].typed == "-j 4" and ex["workers"].suggestion == "-j {workers}"
    dotted = explicit_knobs(["--trainer.batch_size=32"])["batch_size"]
    assert dotted.suggestion == "--trainer.batch_size={batch_size}"
    assert dotted.number == 32
    assert explicit_knobs(["--bs", "auto"])["batch_size"].number is None


def test_note_says_which_wins_and_how_to_tune():
    note = explicit_knobs(["--batch-size", "32"])["batch_size"].note()
    assert "stays 32" in note and "'--batch-size 32'" in note
    assert "'--batch-size {batch_size}'" in note


def test_split_knobs_drops_only_what_the_user_fixed():
    kept, won = split_knobs({"batch_size": 64, "workers": 2, "threads": 1},
                            ["--batch-size", "32", "--epochs", "3"])
    assert kept == {"workers": 2, "threads": 1}
    assert [e.knob for e in won] == ["batch_size"]
    kept, won = split_knobs({"workers": 2}, ["--batch-size", "32"])
    assert kept == {"workers": 2} and won == []
