"""A script's source read for whether it could ever join a process group
(`autotune.launching.script_source`): "never" only when every file of its own tree it imports
was read and none names what starts ranks, and every other import is known to start none."""

import pytest

from autotune.launching import script_source
from autotune.launching.script_source import markers_in, never_parallel, unknown_packages
from conftest import SCRIPTS

PLAIN = "import torch\nfrom torch.utils.data import DataLoader\nprint('train')\n"


def tree(tmp_path, files: dict[str, str]):
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


@pytest.mark.parametrize("text,found", [
    (PLAIN, []),
    ("import torch.distributed as dist\n", ["distributed"]),
    ("from torch.nn.parallel import DistributedDataParallel as DDP\n",
     ["DistributedDataParallel", "DDP"]),
    ("rank = int(os.environ.get('LOCAL_RANK', 0))\n", ["LOCAL_RANK"]),
    ("if os.environ.get('RANK'):\n    pass\n", ["RANK"]),
    ("n = int(os.environ['LOCAL_WORLD_SIZE']); r = os.environ['SLURM_PROCID']\n",
     ["LOCAL_WORLD_SIZE", "SLURM_PROCID"]),
    ("r = int(os.environ['OMPI_COMM_WORLD_RANK']); node = os.environ['NODE_RANK']\n",
     ["OMPI_COMM_WORLD_RANK", "NODE_RANK"]),
    ("backend = 'nccl' if cuda else 'gloo'\n", ["nccl", "gloo"]),
    ("# launch with torchrun --nproc_per_node 8\n", ["torchrun"]),
    ("mp.spawn(worker, nprocs=2)\n", ["spawn"]),
    ("mod = importlib.import_module(name)\n", ["import_module"]),
    ("exec(open('config.py').read())\n", ["exec"]),
    # words that only contain a marker are not one
    ("parser.add_argument('--accel', help='Enables accelerated training')\n", []),
    ("RANKING = 3; os.execv(a, b); distributedness = 1\n", []),
])
def test_the_marker_words_are_whole_words(text, found):
    assert markers_in(text) == found


@pytest.mark.parametrize("tops,unknown", [
    ({"os", "sys", "math", "argparse", "torch", "numpy", "tiktoken"}, []),
    ({"os", "transformers", "lightning"}, ["lightning", "transformers"]),
    ({"subprocess", "torch"}, ["subprocess"]),  # the standard library may start processes
    ({"multiprocessing"}, ["multiprocessing"]),
    ({"my_private_pkg"}, ["my_private_pkg"]),  # not found in the tree, and not known
])
def test_imports_outside_the_tree_are_known_to_start_no_ranks_or_unknown(tops, unknown):
    assert unknown_packages(tops) == unknown


def test_a_script_and_its_own_modules_naming_nothing_parallel_can_never_join_a_group(tmp_path):
    tree(tmp_path, {"train.py": "import model\nfrom data import corpus\nfrom pkg.sub import f\n",
                    "model.py": PLAIN, "data/__init__.py": "", "data/corpus.py": "import math\n",
                    "pkg/__init__.py": "from . import sub\n",
                    "pkg/sub.py": "from .helpers import g\n", "pkg/helpers.py": "import json\n"})
    why = never_parallel(["train.py", "--batch-size", "8"], str(tmp_path), {})
    assert why.startswith("its source never starts torch.distributed (train.py and 6 module(s)")
    assert why.endswith("so extra ranks would each train alone")


@pytest.mark.parametrize("files", [
    # a module of its own names DDP
    {"train.py": "import model\n", "model.py": "from torch.nn.parallel import "
                                               "DistributedDataParallel\n"},
    # a package of its own whose __init__ reads the rank
    {"train.py": "from pkg.m import f\n", "pkg/__init__.py": "import os\nR = os.environ['RANK']\n",
     "pkg/m.py": "def f(): pass\n"},
    # a framework that starts ranks when launched
    {"train.py": "from transformers import Trainer, TrainingArguments\n"},
    {"train.py": "import lightning as L\n"},
    {"train.py": "import accelerate\n"},
    # something it cannot follow
    {"train.py": "import subprocess\nsubprocess.run(['python', 'worker.py'])\n"},
    {"train.py": "def broken(:\n"},
    {"train.py": "from .missing import x\n"},
    {"train.py": "import some_package_not_known\n"},
])
def test_a_script_that_may_start_ranks_or_cannot_be_followed_is_probed(tmp_path, files):
    tree(tmp_path, files)
    assert never_parallel(["train.py"], str(tmp_path), {}) == ""


def test_a_model_class_from_transformers_starts_no_ranks_but_its_trainer_may(tmp_path):
    """minGPT loads GPT-2 weights through ``from transformers import GPT2LMHeadModel``."""
    tree(tmp_path, {"a.py": "from transformers import GPT2LMHeadModel\n",
                    "b.py": "from transformers import GPT2LMHeadModel, Trainer\n",
                    "c.py": "import transformers\n"})
    assert never_parallel(["a.py"], str(tmp_path), {})
    assert never_parallel(["b.py"], str(tmp_path), {}) == ""
    assert never_parallel(["c.py"], str(tmp_path), {}) == ""


def test_modules_are_found_on_pythonpath_as_the_ranks_find_them(tmp_path):
    """minGPT's chargpt runs from projects/chargpt with the repository on PYTHONPATH."""
    tree(tmp_path, {"repo/mingpt/__init__.py": "", "repo/mingpt/model.py": PLAIN,
                    "repo/mingpt/trainer.py": "from torch.utils.data import DataLoader\n",
                    "repo/projects/run/run.py": "from mingpt.model import GPT\n"
                                                "from mingpt.trainer import Trainer\n"})
    cwd = str(tmp_path / "repo" / "projects" / "run")
    assert never_parallel(["run.py"], cwd, {}) == ""  # mingpt not found: not known
    assert "run.py and 3 module(s)" in never_parallel(["run.py"], cwd,
                                                      {"PYTHONPATH": str(tmp_path / "repo")})
    # a module of the tree that names a marker is read there too
    (tmp_path / "repo" / "mingpt" / "trainer.py").write_text("import torch.distributed\n")
    assert never_parallel(["run.py"], cwd, {"PYTHONPATH": str(tmp_path / "repo")}) == ""


def test_commands_that_are_not_a_python_file_are_probed(tmp_path):
    tree(tmp_path, {"run.sh": "#!/bin/sh\npython train.py\n", "train.py": PLAIN})
    assert never_parallel(["run.sh"], str(tmp_path), {}) == ""
    assert never_parallel(["missing.py"], str(tmp_path), {}) == ""
    assert never_parallel([], str(tmp_path), {}) == ""
    assert never_parallel(["train.py"], str(tmp_path), {})


def test_a_tree_too_large_to_read_is_probed(tmp_path, monkeypatch):
    monkeypatch.setattr(script_source, "MAX_FILES", 3)
    tree(tmp_path, {"train.py": "import a, b, c, d\n", **{f"{m}.py": "" for m in "abcd"}})
    assert never_parallel(["train.py"], str(tmp_path), {}) == ""


@pytest.mark.parametrize("name,never", [
    ("tune_toy.py", True), ("_tiny.py", True), ("word_lm.py", True),
    ("shape_ddp_when_launched.py", False), ("noise_toy.py", False), ("fw_hf_trainer.py", False),
    ("fw_lightning.py", False), ("fw_accelerate.py", False), ("shape_spawn.py", False),
    ("tune_toy_logs_rank.py", False)])
def test_the_suites_scripts_read_as_what_they_are(name, never):
    assert bool(never_parallel([name], str(SCRIPTS), {})) == never
