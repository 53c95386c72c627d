"""`TrialResult` as the journal, ``probe.json`` and ``tune.json`` hold it: its measured values
typed in memory, each written by its own ``to_dict`` and read back by its own ``from_dict``."""

import json

from autotune import Note, NoteKind
from autotune.measuring.breakdown import Breakdown
from autotune.measuring.energy import EnergyPerSample
from autotune.measuring.noise import NoiseEstimate
from autotune.measuring.outcome import Outcome
from autotune.measuring.result import TrialResult, note_of
from autotune.store import jsontext
from autotune.tuning.records import BaselineRecord, ProbeFacts
from probes.protocol import Mode
from results import trial_result

PARTS = Breakdown({"data": (0.12344, 0.01), "forward": (0.5, 0.02), "other": (0.37656, 0.03)},
                  ranks=2)
ENERGY = EnergyPerSample(None, 0.25, "", "RAPL package energy", gpu_why="no GPU in use")
NOISE = NoiseEstimate(137.0, steps=900, b_small=16, b_big=32, ranks=2, grad_sq=1.0,
                      trace_cov=137.0)


def result(**over) -> TrialResult:
    return trial_result(**{**dict(
        samples_per_s=195.0, ci_half=3.0, measured_s=8.0, duration_s=12.0, foreign_cores=0.1,
        exit_code=None, log_path="/x/trial-rank0.log", seen={"batch_size": 32},
        knobs={"batch_size": 32}, mode=Mode.SYNTHETIC,
        notes=(Note.info("samples per step: 32"), Note.warning("wrote into your tree")),
        breakdown=PARTS, energy=ENERGY, noise=NOISE), **over})


def test_a_result_reads_back_from_its_json_as_it_was():
    r = result()
    back = TrialResult.from_dict(json.loads(jsontext.dumps(r)))
    assert back.breakdown == Breakdown(PARTS.rounded_shares(), 2)  # written to four decimals
    assert back == result(breakdown=back.breakdown)
    assert back.mode is Mode.SYNTHETIC and back.outcome is Outcome.OK


def test_the_json_keeps_its_shapes():
    d = json.loads(jsontext.dumps(result()))
    assert d["mode"] == "synthetic" and d["outcome"] == "ok" and d["foreign_flagged"] is False
    assert d["breakdown"] == {"shares": {"data": [0.1234, 0.01], "forward": [0.5, 0.02],
                                         "other": [0.3766, 0.03]}, "ranks": 2, "clock": "host"}
    assert d["energy"] == {"gpu_j_per_sample": None, "cpu_j_per_sample": 0.25,
                           "gpu": "unavailable: no GPU in use", "cpu": "RAPL package energy"}
    assert d["noise"]["noise_scale"] == 137.0 and "reason" not in d["noise"]
    assert d["notes"] == [{"kind": "info", "text": "samples per step: 32"},
                          {"kind": "warning", "text": "wrote into your tree"}]
    none = json.loads(jsontext.dumps(result(breakdown=None, energy=None, noise=None)))
    assert none["breakdown"] is none["energy"] is none["noise"] is None


def test_notes_of_earlier_journals_were_text():
    assert note_of("WARNING: --metric says 10 samples/s") == Note.warning("--metric says 10 "
                                                                          "samples/s")
    assert note_of("samples per step: 16").kind is NoteKind.INFO
    d = {**result().to_dict(), "notes": ["WARNING: a", "b"]}
    assert [n.kind for n in TrialResult.from_dict(d).notes] == [NoteKind.WARNING, NoteKind.INFO]


def test_the_baseline_record_reads_back_from_tune_json():
    b = BaselineRecord({"batch_size": 32}, 195.0, 3.0, "dataloader", {"batch_size": 32},
                       Breakdown(PARTS.rounded_shares(), 2), ENERGY, NOISE)
    assert BaselineRecord.from_dict(json.loads(json.dumps(b.to_dict()))) == b
    # tune.json of earlier versions: the same keys, the values as their to_dict wrote them
    old = {"knobs": {"batch_size": 32}, "samples_per_s": 195.0, "ci_half": 3.0,
           "source": "dataloader", "seen": {}, "breakdown": None,
           "energy": ENERGY.to_dict(), "noise": {"noise_scale": None, "reason": "one rank"}}
    read = BaselineRecord.from_dict(old)
    assert read.energy == ENERGY and read.noise.reason == "one rank" and read.breakdown is None


def test_probe_facts_keep_the_summary_shape():
    facts = ProbeFacts(breakdown=PARTS, core_s_per_sample=0.002, energy=ENERGY)
    assert facts.to_dict() == {"breakdown": PARTS.to_dict(), "core_s_per_sample": 0.002,
                               "gpu_s_per_sample": 0.0, "energy": ENERGY.to_dict()}
