"""Where ranks on other hosts reach the controller (`autotune.launching.reach`): the rules in
their order, over given facts, and the one line when none gives an address."""

import os
import stat

import pytest

from autotune import LaunchError
from autotune.launching import engines, reach
from autotune.launching.reach import Facts, choose

ETH = {"lo": ("127.0.0.1",), "eth0": ("10.0.0.5",), "ib0": ("192.168.7.5",),
       "docker0": ("172.17.0.1",)}
DEBIAN = frozenset({"vm", "vm.cluster"})  # /etc/hosts: 127.0.1.1 vm.cluster vm
SCONTROL = ("NodeName=vm Arch=x86_64 CoresPerSocket=1 CPUAlloc=1 CPUTot=1 NodeAddr=10.0.0.5 "
            "NodeHostName=vm Version=22.05.8 OS=Linux State=ALLOCATED Partitions=bed")


def facts(**kw) -> Facts:
    base = dict(env={}, interfaces=ETH, names=("vm.cluster", "vm"), loopback=DEBIAN)
    return Facts(**{**base, **kw})


def test_the_variable_overrides_everything():
    got = choose(facts(env={"AUTOTUNE_COLLECTOR_HOST": "head.example",
                            "GLOO_SOCKET_IFNAME": "ib0", "SLURMD_NODENAME": "vm"},
                       node_addr="10.0.0.5"))
    assert got == reach.Choice("head.example", "$AUTOTUNE_COLLECTOR_HOST")


@pytest.mark.parametrize("env, want", [
    ({"GLOO_SOCKET_IFNAME": "ib0"}, ("192.168.7.5", "ib0", "GLOO_SOCKET_IFNAME")),
    ({"GLOO_SOCKET_IFNAME": "eth9,eth0"}, ("10.0.0.5", "eth0", "GLOO_SOCKET_IFNAME")),
    # gloo's wins over NCCL's; NCCL's are prefixes, `=` exact, `^` passed over
    ({"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "ib"},
     ("10.0.0.5", "eth0", "GLOO_SOCKET_IFNAME")),
    ({"NCCL_SOCKET_IFNAME": "ib"}, ("192.168.7.5", "ib0", "NCCL_SOCKET_IFNAME")),
    ({"NCCL_SOCKET_IFNAME": "=eth0"}, ("10.0.0.5", "eth0", "NCCL_SOCKET_IFNAME")),
    ({"NCCL_SOCKET_IFNAME": "^eth"}, ("192.168.7.5", "ib0", "NCCL_SOCKET_IFNAME")),
])
def test_the_interface_the_job_names_gives_its_address(env, want):
    got = choose(facts(env={**env, "SLURMD_NODENAME": "vm"}, node_addr="10.9.9.9"))
    addr, iface, var = want
    assert got.host == addr
    assert got.how == f"the address of {iface}, the interface {var} names"
    assert got.text().startswith(f"ranks on other hosts reach this controller at {addr}: ")
    assert "AUTOTUNE_COLLECTOR_HOST sets another" in got.text()


@pytest.mark.parametrize("env", [{"GLOO_SOCKET_IFNAME": "eth9"},
                                 {"NCCL_SOCKET_IFNAME": "=eth"},
                                 {"GLOO_SOCKET_IFNAME": "lo"}])
def test_an_interface_named_but_missing_is_an_error_not_a_guess(env):
    with pytest.raises(LaunchError) as e:
        choose(facts(env=env, node_addr="10.0.0.5"))
    (var, value), = env.items()
    assert f"{var}={value} names no interface with an IPv4 address on this host" in str(e.value)
    assert "(this host has eth0 10.0.0.5, ib0 192.168.7.5, docker0 172.17.0.1)" in str(e.value)


def test_under_slurm_the_nodes_own_address():
    got = choose(facts(env={"SLURMD_NODENAME": "vm"}, node_addr=reach.node_addr(SCONTROL),
                       routes=(("vm2", "192.168.7.5"),)))
    assert got == reach.Choice("10.0.0.5", "Slurm's address of node vm (its NodeAddr)")


def test_a_loopback_node_address_is_passed_over_for_the_route():
    """NodeAddr defaults to the node's name, which on a Debian node is 127.0.1.1 here."""
    got = choose(facts(env={"SLURMD_NODENAME": "vm"}, node_addr="vm",
                       routes=(("vm", "127.0.1.1"), ("vm2", "10.0.0.5"))))
    assert got == reach.Choice("10.0.0.5", "this host's address on the route to vm2")


@pytest.mark.parametrize("names, loopback, want", [
    (("node1.cluster", "node1"), frozenset(), "node1.cluster"),
    (("localhost", "node1"), frozenset(), "node1"),  # Debian: getfqdn() says localhost
    (("localhost", "vm"), DEBIAN, None),  # and the short name is 127.0.1.1 too
])
def test_a_name_comes_last_and_never_one_that_is_loopback_here(names, loopback, want):
    got = choose(facts(names=names, loopback=loopback))
    assert (got.host if got else None) == want


def test_nothing_left_is_one_line_saying_what_each_rule_found():
    f = facts(env={"SLURMD_NODENAME": "vm"}, node_addr="", node_addr_why="scontrol exited 1: "
              "Invalid node name specified", routes=(("vm", "127.0.1.1"),))
    assert choose(f) is None
    text = str(reach.unreachable(f, ["vm", "vm2"]))
    assert "\n" not in text
    for part in ("this host's name ('vm.cluster', 'vm') resolves to a loopback address here",
                 "no GLOO_SOCKET_IFNAME or NCCL_SOCKET_IFNAME is set",
                 "Slurm's address of node vm is unknown (scontrol exited 1: Invalid node name",
                 "no route to vm, vm2 leaves by another address",
                 "set GLOO_SOCKET_IFNAME to the interface the nodes share, or "
                 "AUTOTUNE_COLLECTOR_HOST", "this host has eth0 10.0.0.5"):
        assert part in text, text


def test_node_addr_is_read_from_scontrol():
    assert reach.node_addr(SCONTROL) == "10.0.0.5"
    assert reach.node_addr("NodeName=vm NodeAddr=(null) State=DOWN") == ""
    assert reach.node_addr("") == ""


def test_is_loopback():
    assert reach.is_loopback("127.0.1.1") and reach.is_loopback("::1")
    assert reach.is_loopback("localhost.localdomain") and reach.is_loopback("vm", DEBIAN)
    assert not reach.is_loopback("10.0.0.5") and not reach.is_loopback("vm2", DEBIAN)


def test_find_asks_slurm_for_the_node_and_settle_keeps_it(tmp_path, monkeypatch):
    """Read from this host: scontrol (a fake that answers as the real one does for this node,
    and refuses any other) is asked only when no interface is named, once for a launcher."""
    calls = tmp_path / "calls"
    fake = tmp_path / "scontrol"
    fake.write_text("#!/bin/sh\necho \"$@\" >> " + str(calls) + "\n"
                    "[ \"$*\" = 'show node -o vm' ] || { echo 'Invalid node name' >&2; "
                    "exit 1; }\necho '" + SCONTROL + "'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    env = {"PATH": f"{tmp_path}:{os.environ['PATH']}", "SLURMD_NODENAME": "vm"}
    monkeypatch.setattr(reach.socket, "getfqdn", lambda: "localhost")
    multi = engines.Launcher(kind="srun", hosts=(engines.Host("vm"), engines.Host("vm2")))
    settled, told = reach.settle(multi, env)
    assert told == reach.Choice("10.0.0.5", "Slurm's address of node vm (its NodeAddr)")
    assert settled.controller_host == "10.0.0.5"
    assert reach.settle(settled, env) == (settled, None)  # found once
    assert reach.settle(engines.Launcher(), env) == (engines.Launcher(), None)  # all here
    assert calls.read_text().splitlines() == ["show node -o vm"]
    with pytest.raises(LaunchError, match="GLOO_SOCKET_IFNAME=no-such-if0 names no interface"):
        reach.find({**env, "GLOO_SOCKET_IFNAME": "no-such-if0"}, ["vm2"])
    assert calls.read_text().splitlines() == ["show node -o vm"]  # not asked: named one


def test_find_routes_to_a_peer_when_nothing_else_says(monkeypatch):
    """No variable, no Slurm, this host's names loopback here: the address the kernel would
    send to the peer from (a UDP socket connected, nothing sent); a peer that resolves to
    loopback, or not at all, is passed over."""
    import psutil

    ours = sorted(a.address for addrs in psutil.net_if_addrs().values() for a in addrs
                  if a.family == reach.socket.AF_INET and not reach.is_loopback(a.address))
    if not ours:
        pytest.skip("this host has no IPv4 address but loopback")
    monkeypatch.setattr(reach.socket, "getfqdn", lambda: "localhost")
    monkeypatch.setattr(reach.socket, "gethostname", lambda: "localhost")
    got = reach.find({}, ["localhost", "no-such-host.invalid", ours[0]])
    assert got == reach.Choice(ours[0], f"this host's address on the route to {ours[0]}")
    with pytest.raises(LaunchError, match="no route to localhost leaves by another address"):
        reach.find({}, ["localhost"])
