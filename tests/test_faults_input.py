"""The fault matrix, bad input: numbers from the command line are finite and in range, a
directory given as the script is named for what it is. Each is one ERROR line, exit 2, before any
probe runs."""

import pytest

from conftest import SCRIPTS, assert_one_error_line, autotune


@pytest.mark.parametrize("argv, word", [
    (("probe", "--seconds", "nan"), "nan"),
    (("probe", "--seconds", "inf"), "inf"),
    (("tune", "--seconds", "nan"), "nan"),
    (("tune", "--confirm-seconds", "nan"), "nan"),
    (("tune", "--foreign-limit", "inf"), "inf"),
    (("tune", "--confirm-seconds", "-1"), "-1"),
])
def test_non_finite_or_negative_numbers_are_usage_errors(tmp_path, argv, word):
    p = autotune(*argv, str(SCRIPTS / "ok.py"), cwd=tmp_path, timeout=60)
    assert_one_error_line(p, word)
    assert not (tmp_path / "runs").exists()


def test_a_directory_given_as_the_script_is_called_a_directory(tmp_path):
    (tmp_path / "proj").mkdir()
    p = autotune("probe", "proj", cwd=tmp_path, timeout=60)
    assert_one_error_line(p, "'proj'", "is a directory")
    assert "not found" not in p.stderr


def test_a_missing_dependency_disables_only_the_commands_that_need_it(tmp_path):
    """A GPU host without optuna: env and probe still work, tune says what is missing."""
    import os

    shadow = tmp_path / "shadow" / "optuna"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'optuna'\", name='optuna')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(shadow.parent), os.environ.get("PYTHONPATH")])))
    assert autotune("env", cwd=tmp_path, env=env, timeout=60).returncode == 0
    p = autotune("tune", str(SCRIPTS / "ok.py"), cwd=tmp_path, env=env, timeout=60)
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert p.returncode == 1 and len(lines) == 1, p.stderr
    assert lines[0].startswith("ERROR: autotune tune needs the Python package 'optuna'")
    assert lines[0].endswith(" -m pip install optuna") and "docs/" not in lines[0], lines[0]
