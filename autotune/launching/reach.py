"""The address ranks on other hosts are told to reach the controller at, found the way the
engines find theirs; the first of these that is not loopback here wins:

1. ``$AUTOTUNE_COLLECTOR_HOST``: the user's word, taken as it is.
2. The interface ``GLOO_SOCKET_IFNAME`` (else ``NCCL_SOCKET_IFNAME``) names: its IPv4 address.
   The job has said which network its ranks use; a name that matches no interface here is an
   error, as it is to gloo and NCCL.
3. Under Slurm, the node's own address: ``SLURMD_NODENAME``'s ``NodeAddr``
   (``scontrol show node``), where slurmctld itself reaches the node.
4. The local address that routes to the other hosts: a UDP socket connected to a peer's
   address says which of ours the kernel would send from (no packet is sent).
5. This host's full name, else its short name.

A Debian host's own name often resolves to ``127.0.1.1`` (its installer writes that into
``/etc/hosts``), and ``getfqdn()`` may then say ``localhost``: on another host either is that
host, so neither is ever told. `choose` is pure over `Facts`; `find` reads them, a rule's facts
only when the rules before it chose nothing (interfaces with psutil, ``scontrol`` through
`autotune.hardware.proc`, routes and names with `socket`).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

HOST_ENV = "AUTOTUNE_COLLECTOR_HOST"
IFNAME_ENVS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
NODE_ENV = "SLURMD_NODENAME"
NCCL_EXCLUDED = ("lo", "docker")  # what NCCL passes over unless told (its own default)


@dataclass(frozen=True)
class Choice:
    """The address told to ranks on other hosts, and why it is that one."""

    host: str
    how: str  # "eth0's address (GLOO_SOCKET_IFNAME)"

    def text(self) -> str:
        return (f"ranks on other hosts reach this controller at {self.host}: {self.how} "
                f"({HOST_ENV} sets another)")


@dataclass(frozen=True)
class Facts:
    """What the choice is made from. A fact not read yet is empty."""

    env: Mapping[str, str]
    interfaces: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # IPv4s by name
    node_addr: str = ""  # Slurm's NodeAddr of SLURMD_NODENAME
    node_addr_why: str = ""  # why it is not known, when Slurm was asked
    routes: tuple[tuple[str, str], ...] = ()  # (peer host, our address that routes to it)
    names: tuple[str, ...] = ()  # this host's full and short names
    loopback: frozenset[str] = frozenset()  # names that resolve only to loopback here


def is_loopback(host: str, loopback_names: frozenset[str] = frozenset()) -> bool:
    """An address in 127/8 or ::1, ``localhost``, or a name in ``loopback_names``."""
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return host.split(".")[0] == "localhost" or host in loopback_names


def ifname_request(env: Mapping[str, str]) -> tuple[str, str] | None:
    """The first of `IFNAME_ENVS` set, with its value."""
    for name in IFNAME_ENVS:
        if env.get(name, "").strip():
            return name, env[name].strip()
    return None


def named_interface(var: str, value: str,
                    interfaces: Mapping[str, tuple[str, ...]]) -> tuple[str, str] | None:
    """(interface, IPv4 address) of the first interface ``var=value`` names that has one.
    Gloo reads a comma list of exact names; NCCL a list of prefixes, ``=`` for exact names,
    ``^`` for names to pass over (`NCCL_EXCLUDED` being passed over by default)."""
    exact, exclude = var == "GLOO_SOCKET_IFNAME", False
    if var == "NCCL_SOCKET_IFNAME":
        exclude = value.startswith("^")
        exact = value.startswith("=")
        value = value.lstrip("^=")
    words = [w.strip() for w in value.split(",") if w.strip()]

    def named(iface: str) -> bool:
        return any(iface == w if exact else iface.startswith(w) for w in words)

    if exclude:
        order = [i for i in interfaces if not named(i)
                 and not any(i.startswith(x) for x in NCCL_EXCLUDED)]
    elif exact:
        order = [w for w in words if w in interfaces]
    else:
        order = [i for w in words for i in interfaces if i.startswith(w)]
    for iface in order:
        usable = [a for a in interfaces[iface] if not is_loopback(a)]
        if usable:
            return iface, usable[0]
    return None


def node_addr(scontrol_text: str) -> str:
    """``NodeAddr`` from ``scontrol show node`` output ("" when it has none)."""
    m = re.search(r"\bNodeAddr=(\S+)", scontrol_text)
    return m.group(1) if m and m.group(1) not in ("(null)", "") else ""


def choose(facts: Facts) -> Choice | None:
    """The first rule (the module's docstring) that gives an address not loopback here; None
    when the facts read so far give none. A ``*_SOCKET_IFNAME`` naming no usable interface
    here raises `autotune.LaunchError`."""
    env, loop = facts.env, facts.loopback
    given = env.get(HOST_ENV, "").strip()
    if given:
        return Choice(given, f"${HOST_ENV}")
    request = ifname_request(env)
    if request is not None:
        found = named_interface(*request, facts.interfaces)
        if found is None:
            from autotune import LaunchError

            raise LaunchError(f"{request[0]}={request[1]} names no interface with an IPv4 "
                              f"address on this host{_interfaces_text(facts.interfaces)}; "
                              f"correct it, or set {HOST_ENV} to this host's address on the "
                              f"network the nodes share")
        return Choice(found[1], f"the address of {found[0]}, the interface {request[0]} names")
    if facts.node_addr and not is_loopback(facts.node_addr, loop):
        return Choice(facts.node_addr,
                      f"Slurm's address of node {env.get(NODE_ENV)} (its NodeAddr)")
    for peer, ours in facts.routes:
        if not is_loopback(ours, loop):
            return Choice(ours, f"this host's address on the route to {peer}")
    for name in facts.names:
        if name and not is_loopback(name, loop):
            return Choice(name, "this host's name")
    return None


def unreachable(facts: Facts, peers: Sequence[str]):
    """The `autotune.LaunchError` when no rule gave an address: what each rule found."""
    from autotune import LaunchError

    tried = ["no GLOO_SOCKET_IFNAME or NCCL_SOCKET_IFNAME is set"]
    if facts.env.get(NODE_ENV):
        tried.append(f"Slurm's address of node {facts.env[NODE_ENV]} is "
                     f"{facts.node_addr or 'unknown'}"
                     + (f" ({facts.node_addr_why})" if facts.node_addr_why else ""))
    tried.append(f"no route to {', '.join(peers) or 'another host'} leaves by another address"
                 if peers else "no other host is known to route to")
    names = ", ".join(repr(n) for n in dict.fromkeys(facts.names) if n)
    return LaunchError(
        f"ranks on other hosts cannot reach this controller: this host's name ({names}) "
        f"resolves to a loopback address here, {'; '.join(tried)}; set GLOO_SOCKET_IFNAME to "
        f"the interface the nodes share, or {HOST_ENV} to this host's address on it"
        f"{_interfaces_text(facts.interfaces)}")


def _interfaces_text(interfaces: Mapping[str, tuple[str, ...]]) -> str:
    shown = [f"{i} {a}" for i, addrs in interfaces.items() for a in addrs if not is_loopback(a)]
    return f" (this host has {', '.join(shown)})" if shown else ""


# ---------------------------------------------------------------- reading the facts


def settle(launcher, env: Mapping[str, str] | None = None):
    """``launcher`` (an `autotune.launching.engines.Launcher`) with its ``controller_host``
    found once, before anything runs, and the `Choice` to tell; a launcher whose ranks all run
    here, or that has its address already, is returned as it is, with None."""
    import os

    if not launcher.multi_host or launcher.controller_host:
        return launcher, None
    got = find(os.environ if env is None else env, [h.name for h in launcher.hosts])
    return replace(launcher, controller_host=got.host), got


def find(env: Mapping[str, str], peers: Sequence[str] = ()) -> Choice:
    """The address for ranks on ``peers`` (the run's hosts, this one among them maybe), read
    from this host; `autotune.LaunchError` when none is found."""
    facts = Facts(env={k: env[k] for k in (HOST_ENV, *IFNAME_ENVS, NODE_ENV, "SLURM_CONF")
                       if k in env})
    stages: tuple[Callable[[Facts, Mapping[str, str], Sequence[str]], Facts], ...] = (
        _read_interfaces, _read_node_addr, _read_routes, _read_names)
    for read in stages:
        facts = read(facts, env, peers)
        got = choose(facts)
        if got is not None:
            return got
    raise unreachable(facts, peers)


def _read_interfaces(facts: Facts, env, peers) -> Facts:
    if facts.env.get(HOST_ENV, "").strip():
        return facts
    import psutil

    return replace(facts, interfaces={
        name: tuple(a.address for a in addrs if a.family == socket.AF_INET)
        for name, addrs in psutil.net_if_addrs().items()})


def _read_node_addr(facts: Facts, env, peers) -> Facts:
    node = env.get(NODE_ENV, "").strip()
    if not node:
        return facts
    from autotune import LaunchError
    from autotune.hardware import proc

    try:
        out = proc.run_command(["scontrol", "show", "node", "-o", node], env=dict(env),
                               timeout_s=15.0, marker="autotune-scontrol")
    except LaunchError as exc:
        return replace(facts, node_addr_why=f"scontrol: {exc}")
    if out.returncode != 0:
        return replace(facts, node_addr_why=f"scontrol exited {out.returncode}: "
                                            f"{out.stderr.strip()[:200]}")
    addr = node_addr(out.stdout)
    return replace(facts, node_addr=addr,
                   loopback=facts.loopback | _loopback_names([addr]))


def _read_routes(facts: Facts, env, peers) -> Facts:
    routes = []
    for peer in dict.fromkeys(peers):
        try:
            infos = socket.getaddrinfo(peer, None, socket.AF_INET, socket.SOCK_DGRAM)
        except OSError:
            continue
        far = next((i[4][0] for i in infos if not is_loopback(i[4][0])), None)
        if far is None:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.connect((far, 9))  # UDP: the kernel picks the route; nothing is sent
                routes.append((peer, s.getsockname()[0]))
            except OSError:
                continue
    return replace(facts, routes=tuple(routes))


def _read_names(facts: Facts, env, peers) -> Facts:
    names = (socket.getfqdn(), socket.gethostname())
    return replace(facts, names=names, loopback=facts.loopback | _loopback_names(names))


def _loopback_names(names: Sequence[str]) -> frozenset[str]:
    """Those of ``names`` that resolve only to loopback addresses here (one that does not
    resolve here may still resolve on the nodes: not ruled out)."""
    out = set()
    for name in names:
        if not name or is_loopback(name):
            continue
        try:
            infos = socket.getaddrinfo(name, None)
        except OSError:
            continue
        if infos and all(is_loopback(i[4][0]) for i in infos):
            out.add(name)
    return frozenset(out)
