"""Pure parts of the probes side: batch sizes, knob application, environment parsing."""

import torch

from probes import protocol
from probes.boot import is_oom
from probes.intercept import apply_loader_knobs, knobs_from_env, loader_facts
from probes.meter import Meter, batch_len


def test_batch_len_shapes():
    x = torch.zeros(7, 3)
    assert batch_len(x) == 7
    assert batch_len((x, torch.zeros(7))) == 7
    assert batch_len([x]) == 7
    assert batch_len({"input_ids": torch.zeros(5, 9), "labels": torch.zeros(5)}) == 5
    assert batch_len({"meta": "x", "pixels": torch.zeros(4, 3, 8, 8)}) == 4
    assert batch_len(["a", "b", "c"]) == 3
    assert batch_len(torch.tensor(1.0)) == 1
    assert batch_len(object()) == 0


def defaults(**over):
    args = {"batch_size": 1, "batch_sampler": None, "num_workers": 0, "prefetch_factor": None,
            "persistent_workers": False}
    args.update(over)
    return args


def test_loader_knobs_applied():
    args, notes = apply_loader_knobs(defaults(batch_size=32), {"batch_size": 64, "workers": 2})
    assert args["batch_size"] == 64 and args["num_workers"] == 2 and notes == []


def test_loader_workers_zero_drops_multiprocessing_only_options():
    args, notes = apply_loader_knobs(
        defaults(num_workers=4, prefetch_factor=4, persistent_workers=True), {"workers": 0})
    assert args["num_workers"] == 0
    assert args["prefetch_factor"] is None and args["persistent_workers"] is False
    assert len(notes) == 2
    torch.utils.data.DataLoader(list(range(4)), batch_size=2,
                                **{k: args[k] for k in ("num_workers", "prefetch_factor",
                                                        "persistent_workers")})


def test_prefetch_and_persistent_workers_apply_only_with_workers():
    knobs = {"prefetch": 8, "persistent": 1, "pin_memory": 1}
    args, _ = apply_loader_knobs(defaults(num_workers=2), knobs)
    assert (args["prefetch_factor"], args["persistent_workers"], args["pin_memory"]) == \
        (8, True, True)
    torch.utils.data.DataLoader(list(range(4)), batch_size=2,
                                **{k: args[k] for k in ("num_workers", "prefetch_factor",
                                                        "persistent_workers")})
    args, _ = apply_loader_knobs(defaults(num_workers=2), {**knobs, "workers": 0})
    assert args["prefetch_factor"] is None and args["persistent_workers"] is False
    assert args["pin_memory"] is True  # torch pins in the main process as well
    assert loader_facts(defaults(num_workers=2)) == {"batch_size": 1, "workers": 2,
                                                     "prefetch": 2, "persistent": 0,
                                                     "pin_memory": 0, "dataset_len": None}
    assert loader_facts(defaults(dataset=list(range(7))))["dataset_len"] == 7
    assert loader_facts(defaults())["prefetch"] is None


def test_loader_batch_sampler_not_touched():
    sampler = object()
    args, notes = apply_loader_knobs(defaults(batch_size=1, batch_sampler=sampler),
                                     {"batch_size": 64})
    assert args["batch_size"] == 1 and args["batch_sampler"] is sampler
    assert "batch_sampler" in notes[0]


def test_loader_without_auto_batching_not_touched():
    args, notes = apply_loader_knobs(defaults(batch_size=None), {"batch_size": 64})
    assert args["batch_size"] is None and "automatic batching" in notes[0]


def test_knobs_from_env(capsys):
    env = {protocol.ENV_BATCH_SIZE: "48", protocol.ENV_WORKERS: "3",
           protocol.ENV_BUCKET_MB: "12.5", protocol.ENV_THREADS: "two"}
    assert knobs_from_env(env) == {"batch_size": 48, "workers": 3, "bucket_mb": 12.5}
    assert "AUTOTUNE_THREADS" in capsys.readouterr().err


def test_is_oom():
    assert is_oom(MemoryError())
    assert is_oom(RuntimeError("[enforce fail at alloc_cpu.cpp:117] . DefaultCPUAllocator: "
                               "can't allocate memory: you tried to allocate 70368744177664 bytes"))
    assert is_oom(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not is_oom(ValueError("bad config"))


def test_protocol_roundtrip_and_rejects():
    msg = protocol.decode(protocol.encode(protocol.TICK, samples=3).rstrip(b"\n"))
    assert msg == {"type": "tick", "samples": 3}
    for bad in (b"[1,2]", b'{"no":"type"}', b"not json"):
        try:
            protocol.decode(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} was accepted")


def test_a_tick_carries_the_fields_the_protocol_names():
    class Sent:
        def send(self, kind, **fields):
            self.kind, self.fields = kind, fields

    meter = Meter(env={})
    meter.channel = Sent()
    meter.count_batch(torch.zeros(4, 2), training=True)
    meter.count_step()
    meter.send_tick()
    assert meter.channel.kind == protocol.TICK
    named = {v for k, v in vars(protocol).items() if k.startswith("TICK_")}
    # the gradient norms only once a DDP rank of a world of two or more measured them
    assert set(meter.channel.fields) == named - {protocol.TICK_NOISE} and len(named) == 15
    assert meter.channel.fields[protocol.TICK_SAMPLES] == 4
    assert meter.channel.fields[protocol.TICK_STEPS] == 1
    meter.noise.before(torch.ones(4))
    meter.noise.after(torch.ones(4))
    meter.close_backward()
    meter.send_tick()
    assert set(meter.channel.fields) == named
    assert set(meter.channel.fields[protocol.TICK_NOISE]) == set(protocol.NOISE_FIELDS)
