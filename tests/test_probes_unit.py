"""Pure parts of the probes side: batch sizes, knob application, environment parsing."""

import pytest
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


# -- synthetic replay: where an epoch ends ----------------------------------------------------
def test_real_pace_is_the_scripts_pace_over_the_batches_that_filled_the_cache():
    from probes.intercept import real_pace_s

    assert real_pace_s([]) is None
    assert real_pace_s([(10.0, 10.5)]) == 0.5  # one batch: its fetch
    # the first fetch's start-up is left out; the script's work between fetches counts
    assert real_pace_s([(10.0, 12.0), (12.1, 12.2), (12.3, 12.4), (12.5, 12.6)]) == \
        pytest.approx(0.2)


@pytest.mark.parametrize("yielded, now, over", [
    (99, 500.0, False),  # short of the loader's length: never over
    (100, 105.0, False),  # at its length, but the real loader (10 s) would still be yielding
    (100, 110.0, True),  # ... and now it would have yielded all 100
    (400, 109.0, False),  # replayed on past the length while the real loader would go on
])
def test_a_replayed_epoch_ends_no_sooner_than_the_real_loader_would(yielded, now, over):
    from probes.intercept import replayed_epoch_over

    assert replayed_epoch_over(yielded=yielded, epoch_len=100, started_t=100.0, pace_s=0.1,
                               now=now) is over


def test_a_replayed_epoch_without_a_pace_or_a_length():
    from probes.intercept import replayed_epoch_over

    # no pace known: the loader's length, as torch's own epoch
    assert replayed_epoch_over(yielded=8, epoch_len=8, started_t=0.0, pace_s=None, now=0.0)
    # an iterable dataset has no length: the replay never ends it
    assert not replayed_epoch_over(yielded=10 ** 6, epoch_len=None, started_t=0.0, pace_s=0.0,
                                   now=1e9)


def test_the_end_of_the_scripts_data_is_told_from_other_exceptions():
    from probes.boot import error_report

    def raised(fn):
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - the test hands it on
            return exc

    def gen():
        yield next(iter([]))

    assert error_report(raised(lambda: next(iter([]))))["kind"] == protocol.ERROR_STOP_ITERATION
    pep479 = raised(lambda: list(gen()))  # a generator turns it into a RuntimeError
    assert isinstance(pep479, RuntimeError)
    assert error_report(pep479)["kind"] == protocol.ERROR_STOP_ITERATION
    assert error_report(raised(lambda: 1 / 0))["kind"] == "exception"
    assert error_report(RuntimeError("generator raised StopIteration"))["kind"] == "exception"


def test_the_meter_knows_a_forked_child_s_pid_without_asking_the_kernel():
    """The counting hooks compare the pid on every batch and step: a fork hook keeps it, so a
    forked child (a Hogwild worker, say) still tells itself from its parent."""
    import os

    from probes.meter import current_pid

    assert current_pid() == os.getpid()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child: its own pid, as the kernel gives it
        os.write(write, f"{current_pid()} {os.getpid()}".encode())
        os._exit(0)
    os.close(write)
    seen, real = map(int, os.read(read, 64).split())
    os.close(read)
    os.waitpid(child, 0)
    assert seen == real == child != os.getpid()
    assert current_pid() == os.getpid()
