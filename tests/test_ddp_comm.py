"""DDP's own timers as the CPU's communication clock (`probes.ddp_comm`): the arithmetic on the
figures DDP hands over, and a real model read while it trains."""

import gc

import pytest

from probes import ddp_comm


def data(iteration, comm_ns, overlap_ns):
    return {"iteration": iteration, "backward_comm_time": comm_ns,
            "backward_compute_comm_overlap_time": overlap_ns, "comm_hook": ""}


def test_the_wait_is_the_communication_that_outlasted_the_backward_compute():
    # the allreduce ran 3 ms, 1 ms of it beside the backward compute: 2 ms waited for
    assert ddp_comm.exposed_s(data(10, 3_000_000, 1_000_000)) == pytest.approx(0.002)
    # all of it hidden (the overlap reads past the comm's end on a fast last bucket)
    assert ddp_comm.exposed_s(data(10, 1_000_000, 1_200_000)) == 0.0
    assert ddp_comm.exposed_s({"iteration": 0}) == 0.0  # before any sampled iteration


@pytest.mark.parametrize("seen, got, want", [
    (0, data(10, 2_000_000, 0), (10, 0.020)),  # the first ten, one sample standing for them
    (10, data(14, 2_000_000, 1_000_000), (14, 0.004)),  # four since: 1 ms each
    (14, data(14, 2_000_000, 0), (14, 0.0)),  # no new sample since the last read
    (14, data(3, 2_000_000, 0), (3, 0.006)),  # a new reducer counts from its own start
    (7, {}, (7, 0.0)),  # nothing to read
])
def test_the_latest_sample_times_every_iteration_since_the_last_read(seen, got, want):
    iteration, seconds = ddp_comm.advance(seen, got)
    assert (iteration, round(seconds, 9)) == want


def test_the_wait_moves_from_the_backward_pass_into_comm():
    parts = {"data": 0.1, "forward": 0.2, "backward": 0.5, "comm": 0.0, "optimizer": 0.1}
    moved = ddp_comm.moved_to_comm(parts, 0.3)
    assert moved == pytest.approx({"data": 0.1, "forward": 0.2, "backward": 0.2, "comm": 0.3,
                                   "optimizer": 0.1})
    assert ddp_comm.moved_to_comm(parts, 0.0) is parts
    # backward passes the hooks did not time: the wait was in "other", and comes out of it
    untimed = ddp_comm.moved_to_comm({**parts, "backward": 0.0}, 0.3)
    assert untimed["backward"] == 0.0 and untimed["comm"] == pytest.approx(0.3)


class Raising:
    def _set_ddp_runtime_logging_sample_rate(self, n):
        self.rate = n

    def _get_ddp_logging_data(self):
        raise RuntimeError("torn down")


def test_a_model_gone_or_failing_is_read_as_nothing_and_a_dead_one_is_dropped():
    comm = ddp_comm.DdpComm()
    assert comm.add(object()) is False  # no such interface: left untimed
    failing = Raising()
    assert comm.add(failing) is True and failing.rate == ddp_comm.SAMPLE_EVERY
    assert comm.read() == 0.0
    del failing
    gc.collect()
    assert comm.read() == 0.0 and comm._models == []


def test_a_real_ddp_model_is_sampled_as_asked_and_its_wait_read_while_it_trains():
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    from torch import nn

    # an in-memory store: no port, and nothing of this group left in the worker's environment
    # for the subprocesses later tests start
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        model = nn.parallel.DistributedDataParallel(nn.Linear(8, 2))
        comm = ddp_comm.DdpComm()
        assert comm.add(model)
        iterations = []
        for step in range(40):
            model(torch.randn(4, 8)).sum().backward()
            comm.read()
            iterations.append(comm._models[0][1][0])
        # sampled on the first ten iterations, then one in four: the count DDP reports
        # advances in steps of SAMPLE_EVERY once past ten
        later = sorted(set(i for i in iterations if i > 10))
        assert later and all(b - a == ddp_comm.SAMPLE_EVERY for a, b in zip(later, later[1:]))
        assert comm.seconds >= 0.0
        del model
    finally:
        dist.destroy_process_group()
