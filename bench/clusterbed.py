"""A real N-host cluster built on this machine, for tests and benches of the multi-node paths.

Each host is a Linux network namespace (``<prefix>-node1`` ...) with its own UTS namespace (so
``hostname`` inside says ``node1``), a veth pair to a bridge in the root namespace, an address on
a private /24 that only the bed uses, ``lo`` up, and the other hosts' names in
``/etc/netns/<ns>/hosts`` (``ip netns exec`` bind-mounts it over ``/etc/hosts``). Every daemon a
host runs is started under ``taskset`` on that host's own cores, so what it starts inherits them.
Links are shaped with ``tc`` (``tbf`` on both ends of each veth); ``netem`` delay is added only
where the kernel has it, which the facts report.

On top: Debian's Slurm 22.05 (``slurmctld`` in the root namespace on the bridge address, one
``slurmd -N nodeK`` per namespace, one ``munged`` run as the munge user serving them all through
its socket path), and an ``sshd`` per namespace with a generated host key, a generated client key,
an ssh config and known_hosts, so that ``ssh node2 true`` works non-interactively from any
namespace and Hydra's ``mpirun -launcher ssh`` starts ranks on every host. Everything (configs,
keys, state, spool, logs, pid files) lives under the bed's own work dir. docs/cluster.md says
why each setting is what it is.

With ``--loopback-names`` each host's own name resolves to ``127.0.1.1`` in its own view (the
other hosts still find it at its address), as Debian's installer leaves ``/etc/hosts``: a host
can then not learn its address from its name, which is what a controller on it must not rely on.

    python bench/clusterbed.py up [--nodes 2] [--rate 1gbit] [--delay-ms 0] [--loopback-names]
                                  [--workdir DIR]
    python bench/clusterbed.py status [--workdir DIR]
    python bench/clusterbed.py down [--workdir DIR]

``up`` prints the facts as JSON and leaves the bed running; ``down`` (idempotent) stops every
process the bed started, deletes its namespaces, links and ``/etc/netns`` entries. Needs root.
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

BED_ENV = "AUTOTUNE_CLUSTERBED"  # in every daemon the bed starts: its work dir
DEFAULT_WORKDIR = Path("/tmp/autotune-clusterbed")
IFNAME = "eth0"  # the bed's interface inside every namespace, the same name on each host
# serialises the choice of subnets across beds (a lock file in the usual place for them)
NET_LOCK = Path("/run/lock" if Path("/run/lock").is_dir() else "/tmp") / "autotune-clusterbed.lock"
SLURMD_PORT = 6818  # each slurmd listens in its own namespace, so every bed can use the default
DAEMONS = ("slurmctld", "slurmscriptd", "slurmd", "slurmstepd", "sshd", "munged")
UP_TIMEOUT_S = 60.0

_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}


class BedError(RuntimeError):
    """The bed could not be built or torn down; the message names the step and the log tails."""


# ---------------------------------------------------------------- pure: specs, facts, file texts


def parse_rate(rate: str) -> int:
    """``'100mbit'`` -> 100_000_000 bits per second (the ``tc`` units the bed accepts)."""
    m = re.fullmatch(r"(\d+)(bit|kbit|mbit|gbit)", rate.strip().lower())
    if not m:
        raise ValueError(f"rate must be like 1gbit, 100mbit or 500kbit, but got {rate!r}")
    return int(m.group(1)) * _RATE_UNITS[m.group(2)]


def tbf_burst_bytes(rate_bits_per_s: int) -> int:
    """The token bucket: 5 ms of the rate, at least 64 KiB so that a GSO packet fits in it."""
    return max(64 * 1024, rate_bits_per_s // 8 // 200)


def split_cores(cpus: list[int], nodes: int) -> tuple[list[list[int]], bool]:
    """Each node's cores: disjoint equal slices when there are enough, else shared round-robin.

    Returns the per-node core lists and whether nodes share cores.
    """
    if nodes < 1:
        raise ValueError(f"nodes >= 1 must hold, but got {nodes}")
    if len(cpus) >= nodes:
        per = len(cpus) // nodes
        return [cpus[i * per:(i + 1) * per] for i in range(nodes)], False
    return [[cpus[i % len(cpus)]] for i in range(nodes)], True


@dataclasses.dataclass(frozen=True)
class BedSpec:
    """What to build: how many hosts, the link rate and delay, names and where files go."""

    nodes: int = 2
    rate: str = "1gbit"
    delay_ms: float = 0.0
    prefix: str = ""  # per-bed unique; empty: f"atb{pid}"
    workdir: Path = DEFAULT_WORKDIR
    loopback_names: bool = False  # each host's own name is 127.0.1.1 in its own /etc/hosts

    def __post_init__(self):
        if not 1 <= self.nodes <= 8:
            raise ValueError(f"1 <= nodes <= 8 must hold, but got {self.nodes}")
        parse_rate(self.rate)
        if self.delay_ms < 0:
            raise ValueError(f"delay_ms >= 0 must hold, but got {self.delay_ms}")
        if self.prefix and not re.fullmatch(r"[a-z][a-z0-9]{1,9}", self.prefix):
            # interface names are at most 15 characters: prefix + "-br" / "-v1"
            raise ValueError("prefix must be 2-10 lowercase letters/digits, "
                             f"but got {self.prefix!r}")


@dataclasses.dataclass(frozen=True)
class BedFacts:
    """What a caller needs to use the bed; ``up`` prints it as JSON."""

    prefix: str
    workdir: str
    hosts: tuple[str, ...]  # host names, resolvable inside every namespace
    namespaces: tuple[str, ...]
    addresses: tuple[str, ...]  # each host's address on the bed's /24, in host order
    controller: str  # ``hostname -s`` of the root namespace, where slurmctld runs
    controller_address: str  # the bridge's address
    bridge: str
    ifname: str  # the interface inside each namespace: GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME
    cores: tuple[tuple[int, ...], ...]  # each host's cores (taskset)
    cores_per_node: int  # what Slurm declares (CPUs=)
    shared_cores: bool  # more hosts than cores: hosts share cores
    rate: str
    rate_bits_per_s: int
    delay_ms: float  # the delay applied (0 when netem is missing)
    netem_available: bool
    partition: str
    slurm_conf: str  # SLURM_CONF: every srun/sbatch/squeue/scancel must see it
    hostfile: str  # one host name a line, for mpirun -f
    ssh: str  # an ssh wrapper that uses the bed's config (Hydra: -launcher-exec)
    ssh_config: str
    loopback_names: bool = False  # each host's own name resolves to 127.0.1.1 on that host

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)

    @classmethod
    def from_dict(cls, d: dict) -> "BedFacts":
        d = dict(d)
        for k in ("hosts", "namespaces", "addresses"):
            d[k] = tuple(d[k])
        d["cores"] = tuple(tuple(c) for c in d["cores"])
        return cls(**d)


def hosts_file(hosts: list[str], addresses: list[str], controller: str,
               controller_addr: str, own: str | None = None) -> str:
    """``/etc/hosts`` for a namespace: localhost, each host, the controller on the bridge; with
    ``own``, that host's name on ``127.0.1.1`` instead of its address, as Debian leaves it."""
    lines = ["127.0.0.1\tlocalhost"]
    if own:
        lines.append(f"127.0.1.1\t{own}")
    lines.append(f"{controller_addr}\t{controller}")
    lines += [f"{a}\t{h}" for h, a in zip(hosts, addresses) if h != own]
    return "\n".join(lines) + "\n"


def slurm_conf(*, cluster: str, controller: str, controller_addr: str, ctld_port: int,
               hosts: list[str], addresses: list[str], cores_per_node: int, slurm_dir: Path,
               munge_socket: Path, partition: str) -> str:
    """slurm.conf for the bed: everything under ``slurm_dir``; docs/cluster.md says why."""
    d = slurm_dir
    lines = [
        f"ClusterName={cluster}",
        f"SlurmctldHost={controller}({controller_addr})",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={SLURMD_PORT}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={d}/state",
        f"SlurmdSpoolDir={d}/spool/%n",
        f"SlurmctldPidFile={d}/run/slurmctld.pid",
        f"SlurmdPidFile={d}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={d}/log/slurmctld.log",
        f"SlurmdLogFile={d}/log/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "ProctrackType=proctrack/pgid",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/builtin",
        "ReturnToService=2",
        "SlurmdTimeout=300",  # a node unreachable this long is DOWN and its jobs requeued
        "InactiveLimit=30",  # an allocation whose salloc/srun was killed is revoked
        "KillWait=5",
        "MinJobAge=60",
        "MailProg=/bin/true",
    ]
    for h, a in zip(hosts, addresses):
        lines.append(f"NodeName={h} NodeAddr={a} CPUs={cores_per_node} Sockets=1 "
                     f"CoresPerSocket={cores_per_node} ThreadsPerCore=1 State=UNKNOWN")
    lines.append(f"PartitionName={partition} Nodes={','.join(hosts)} Default=YES "
                 "MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def cgroup_conf() -> str:
    """22.05 has no "disabled" cgroup plugin: v1 (what this kernel mounts), nothing constrained."""
    return "\n".join([
        "CgroupPlugin=cgroup/v1",
        "ConstrainCores=no",
        "ConstrainRAMSpace=no",
        "ConstrainSwapSpace=no",
        "ConstrainDevices=no",
    ]) + "\n"


def sshd_config(*, address: str, host_key: Path, authorized_keys: Path, pid_file: Path) -> str:
    """One namespace's sshd: root by the generated key only, no DNS, no PAM, files in the bed."""
    return "\n".join([
        "Port 22",
        f"ListenAddress {address}",
        f"HostKey {host_key}",
        f"PidFile {pid_file}",
        f"AuthorizedKeysFile {authorized_keys}",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",
        "UseDNS no",
        "X11Forwarding no",
        "PrintMotd no",
        "AcceptEnv LANG LC_*",
        "MaxStartups 64:30:128",
        "MaxSessions 64",
        "Subsystem sftp internal-sftp",
    ]) + "\n"


def ssh_config(hosts: list[str], addresses: list[str], key: Path, known_hosts: Path) -> str:
    """Client config: each host by name to its address, the bed's key, strict known_hosts."""
    out = []
    for h, a in zip(hosts, addresses):
        out += [f"Host {h} {a}", f"    HostName {a}", f"    HostKeyAlias {h}"]
    out += [
        "Host *",
        "    User root",
        f"    IdentityFile {key}",
        "    IdentitiesOnly yes",
        f"    UserKnownHostsFile {known_hosts}",
        "    GlobalKnownHostsFile /dev/null",
        "    StrictHostKeyChecking yes",
        "    BatchMode yes",
        "    ConnectTimeout 10",
        "    LogLevel ERROR",
    ]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- I/O helpers


def _run(argv: list[str], *, what: str, timeout_s: float = 30.0,
         check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    if check and p.returncode != 0:
        raise BedError(f"{what} failed (exit {p.returncode}): {' '.join(argv)}\n"
                       f"{(p.stderr or p.stdout).strip()}")
    return p


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError as e:
        return f"  ({path}: {e.strerror})"
    return f"  --- {path} (last {len(text)} lines)\n" + "\n".join("    " + t for t in text)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def _poll(condition, *, timeout_s: float, poll_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(poll_s)


def _mentions(pid: int, workdir: Path) -> bool:
    """Whether the command line or the environment (SLURM_CONF) of ``pid`` names ``workdir``."""
    if any(str(workdir) in a for a in _cmdline(pid)):
        return True
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return str(workdir).encode() in f.read()
    except OSError:
        return False


def bed_processes(workdir: Path) -> list[int]:
    """Pids of the bed's daemons found by command line: a daemon's name, the work dir in its
    command line or environment."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        argv = _cmdline(int(entry))
        # slurmctld's helper renames itself ": slurmscriptd": match names anywhere in argv[0]
        if (argv and any(d in argv[0] for d in DAEMONS) and alive(int(entry))
                and _mentions(int(entry), workdir)):
            found.append(int(entry))
    return found


def pid_files(workdir: Path) -> dict[str, int]:
    """The pids the bed's daemons wrote (slurmctld, slurmd-*, sshd_*, munged), by file name."""
    out = {}
    for path in [*workdir.glob("slurm/run/*.pid"), *workdir.glob("ssh/*.pid"),
                 *workdir.glob("munge/*.pid")]:
        try:
            out[path.stem] = int(path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return out


# ---------------------------------------------------------------- the bed


class ClusterBed:
    """Builds, describes and tears down one bed. ``up()`` cleans up after itself on failure.

    A bed built by another process (``clusterbed.py up``) is reached with ``ClusterBed.attach``.
    """

    def __init__(self, spec: BedSpec = BedSpec()):
        prefix = spec.prefix or f"atb{os.getpid()}"
        self.spec = dataclasses.replace(spec, prefix=prefix, workdir=Path(spec.workdir))
        self.workdir = self.spec.workdir
        self.facts: BedFacts | None = None
        self._procs: dict[str, subprocess.Popen] = {}

    # -- naming
    @property
    def prefix(self) -> str:
        return self.spec.prefix

    def _ns(self, i: int) -> str:
        return f"{self.prefix}-node{i + 1}"

    def _state_path(self) -> Path:
        return self.workdir / "bed.json"

    # -- public use
    @classmethod
    def attach(cls, workdir: Path = DEFAULT_WORKDIR) -> "ClusterBed":
        """The bed whose state is in ``workdir`` (built by this or another process)."""
        state = json.loads((Path(workdir) / "bed.json").read_text())
        s = state["spec"]
        bed = cls(BedSpec(nodes=s["nodes"], rate=s["rate"], delay_ms=s["delay_ms"],
                          prefix=s["prefix"], workdir=Path(s["workdir"]),
                          loopback_names=bool(s.get("loopback_names"))))
        if state.get("facts"):
            bed.facts = BedFacts.from_dict(state["facts"])
        return bed

    def env(self, base: dict | None = None) -> dict:
        """The environment for srun/sbatch/squeue/scancel/ssh/mpirun against this bed.

        ``SLURM_CONF`` for every Slurm client; ``PATH`` starting with the bed's ``bin`` (its
        ``ssh`` wrapper, so ``ssh node2`` works); ``HYDRA_LAUNCHER=ssh``,
        ``HYDRA_LAUNCHER_EXEC`` (the wrapper) and ``HYDRA_HOST_FILE`` for MPICH's mpirun.
        """
        f = self._need_facts()
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = f.slurm_conf
        env["PATH"] = f"{self.workdir / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
        env["HYDRA_LAUNCHER"] = "ssh"
        env["HYDRA_LAUNCHER_EXEC"] = f.ssh
        env["HYDRA_HOST_FILE"] = f.hostfile
        return env

    def on(self, host: str, argv: list[str], cores: bool = True) -> list[str]:
        """``argv`` run inside ``host``: its network, /etc/hosts, host name and (default) cores."""
        f = self._need_facts()
        i = f.hosts.index(host)
        out = ["ip", "netns", "exec", f.namespaces[i],
               "nsenter", f"--uts={self.workdir / 'uts' / host}", "--"]
        if cores:
            out += ["taskset", "-c", ",".join(map(str, f.cores[i]))]
        return out + list(argv)

    def run(self, host: str, argv: list[str], *, timeout_s: float = 60.0,
            env: dict | None = None) -> subprocess.CompletedProcess:
        """Run ``argv`` on ``host`` with the bed's env; output captured as text."""
        return subprocess.run(self.on(host, argv), capture_output=True, text=True,
                              env=self.env(env), timeout=timeout_s)

    def _need_facts(self) -> BedFacts:
        if self.facts is None:
            raise BedError(f"the bed in {self.workdir} is not up (no facts); run up() first")
        return self.facts

    # -- up
    def up(self, timeout_s: float = UP_TIMEOUT_S) -> BedFacts:
        """Build the bed and wait until Slurm's nodes are idle and ssh reaches every host.

        Raises BedError naming the failed step with the daemons' log tails; leaves nothing behind.
        """
        if os.geteuid() != 0:
            raise BedError("the cluster bed needs root (network namespaces, tc, daemons)")
        for tool in ("ip", "tc", "nsenter", "unshare", "taskset", "setpriv",
                     "slurmctld", "slurmd", "sinfo", "munged", "sshd", "ssh", "ssh-keygen"):
            if not shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin"):
                raise BedError(f"{tool} not found: install slurm-wlm munge openssh-server "
                               "openssh-client iproute2 util-linux")
        if self._state_path().exists():
            raise BedError(f"a bed's state is already in {self.workdir}: run "
                           f"`python bench/clusterbed.py down --workdir {self.workdir}` first")
        for parent in self.workdir.resolve().parents:
            if parent.exists() and not os.stat(parent).st_mode & 0o001:
                # munged runs as the munge user and resolves its own dir's path
                raise BedError(f"the work dir {self.workdir} must be reachable by the munge "
                               f"user, but {parent} is not searchable by others "
                               f"(mode {os.stat(parent).st_mode & 0o777:o}); pick a work dir "
                               "under /tmp")
        taken = self._own_namespaces() + self._own_links()
        if taken:  # another bed's: never build over it (the cleanup would delete it)
            raise BedError(f"prefix {self.prefix!r} is in use ({', '.join(taken)}); "
                           "choose another --prefix")
        deadline = time.monotonic() + timeout_s
        try:
            self._make_dirs()
            self._save_state()
            self._build_network()
            self._write_configs()
            self._save_state()
            self._start_munge(deadline)
            self._start_sshd(deadline)
            self._start_slurm(deadline)
            self._save_state()
        except BaseException:
            self.down()
            raise
        return self.facts

    def _make_dirs(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.workdir, 0o755)
        for stale in ("slurm/state", "slurm/spool", "slurm/run"):
            # a torn-down bed's Slurm state: its cluster name (slurmctld refuses another) and jobs
            shutil.rmtree(self.workdir / stale, ignore_errors=True)
        for sub in ("bin", "uts", "ssh", "slurm/etc", "slurm/state", "slurm/run", "slurm/log",
                    "slurm/spool", "log", "munge"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)

    def _save_state(self) -> None:
        spec = dataclasses.asdict(self.spec)
        spec["workdir"] = str(self.workdir)
        state = {"spec": spec, "pids": {k: p.pid for k, p in self._procs.items()},
                 "facts": dataclasses.asdict(self.facts) if self.facts else None}
        _write(self._state_path(), json.dumps(state, indent=2))

    def _build_network(self) -> None:
        n = self.spec.nodes
        hosts = [f"node{i + 1}" for i in range(n)]
        namespaces = [self._ns(i) for i in range(n)]
        bridge = f"{self.prefix}-br"
        rate_bps = parse_rate(self.spec.rate)
        cores, shared = split_cores(sorted(os.sched_getaffinity(0)), n)
        controller = socket.gethostname().split(".")[0]
        with open(NET_LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            net = self._free_subnet()
            ctl_addr = f"{net}.1"
            addresses = [f"{net}.{11 + i}" for i in range(n)]
            _run(["ip", "link", "add", bridge, "type", "bridge"], what="creating the bridge")
            _run(["ip", "addr", "add", f"{ctl_addr}/24", "dev", bridge],
                 what="addressing the bridge")
            _run(["ip", "link", "set", bridge, "up"], what="raising the bridge")
        netem = False
        for i, (h, ns, addr) in enumerate(zip(hosts, namespaces, addresses)):
            outer, inner = f"{self.prefix}-v{i + 1}", f"{self.prefix}-p{i + 1}"
            _run(["ip", "netns", "add", ns], what=f"creating namespace {ns}")
            etc = Path("/etc/netns") / ns
            etc.mkdir(parents=True, exist_ok=True)
            _write(etc / "hosts", hosts_file(hosts, addresses, controller, ctl_addr,
                                             own=h if self.spec.loopback_names else None))
            uts = self.workdir / "uts" / h
            uts.touch()
            _run(["unshare", f"--uts={uts}", "hostname", h], what=f"making {h}'s UTS namespace")
            _run(["ip", "link", "add", outer, "type", "veth", "peer", "name", inner],
                 what=f"creating veth {outer}")
            _run(["ip", "link", "set", inner, "netns", ns], what=f"moving {inner} into {ns}")
            for argv in (["link", "set", inner, "name", IFNAME],
                         ["addr", "add", f"{addr}/24", "dev", IFNAME],
                         ["link", "set", IFNAME, "up"], ["link", "set", "lo", "up"]):
                _run(["ip", "-n", ns, *argv], what=f"configuring {ns}")
            _run(["ip", "link", "set", outer, "master", bridge, "up"],
                 what=f"attaching {outer} to {bridge}")
            if i == 0:
                netem = self._netem_available(ns)
            delay = self.spec.delay_ms if netem else 0.0
            self._shape(["tc"], outer, rate_bps, delay)
            self._shape(["tc", "-n", ns], IFNAME, rate_bps, delay)
        self.facts = BedFacts(
            prefix=self.prefix, workdir=str(self.workdir), hosts=tuple(hosts),
            namespaces=tuple(namespaces), addresses=tuple(addresses), controller=controller,
            controller_address=ctl_addr, bridge=bridge, ifname=IFNAME,
            cores=tuple(tuple(c) for c in cores), cores_per_node=len(cores[0]),
            shared_cores=shared, rate=self.spec.rate, rate_bits_per_s=rate_bps,
            delay_ms=self.spec.delay_ms if netem else 0.0, netem_available=netem,
            partition="bed", slurm_conf=str(self.workdir / "slurm/etc/slurm.conf"),
            hostfile=str(self.workdir / "hostfile"), ssh=str(self.workdir / "bin/ssh"),
            ssh_config=str(self.workdir / "ssh/config"), loopback_names=self.spec.loopback_names)

    @staticmethod
    def _free_subnet() -> str:
        """A 10.213.K /24 no interface or route of the root namespace uses yet."""
        used = _run(["ip", "-4", "-o", "addr"], what="listing addresses").stdout
        used += _run(["ip", "-4", "route"], what="listing routes").stdout
        start = os.getpid() % 200
        for k in range(200):
            net = f"10.213.{(start + k) % 200 + 20}"
            if f"{net}." not in used:
                return net
        raise BedError("no free 10.213.K.0/24 for the bed (all of 20..219 in use)")

    @staticmethod
    def _netem_available(ns: str) -> bool:
        p = _run(["tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
                 what="probing netem", check=False)
        if p.returncode == 0:
            _run(["tc", "-n", ns, "qdisc", "del", "dev", "lo", "root"], what="removing the probe")
        return p.returncode == 0

    @staticmethod
    def _shape(tc: list[str], dev: str, rate_bps: int, delay_ms: float) -> None:
        tbf = ["tbf", "rate", f"{rate_bps}bit", "burst", str(tbf_burst_bytes(rate_bps)),
               "latency", "50ms"]
        if delay_ms > 0:
            _run([*tc, "qdisc", "replace", "dev", dev, "root", "handle", "1:", "netem", "delay",
                  f"{delay_ms}ms"], what=f"netem on {dev}")
            _run([*tc, "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", *tbf],
                 what=f"tbf on {dev}")
        else:
            _run([*tc, "qdisc", "replace", "dev", dev, "root", *tbf], what=f"tbf on {dev}")

    def _write_configs(self) -> None:
        f = self._need_facts()
        wd = self.workdir
        slurm = wd / "slurm"
        _write(Path(f.slurm_conf), slurm_conf(
            cluster=self.prefix, controller=f.controller, controller_addr=f.controller_address,
            ctld_port=_free_port(), hosts=list(f.hosts), addresses=list(f.addresses),
            cores_per_node=f.cores_per_node, slurm_dir=slurm,
            munge_socket=wd / "munge/munge.socket", partition=f.partition))
        _write(slurm / "etc/cgroup.conf", cgroup_conf())
        for h in f.hosts:
            (slurm / "spool" / h).mkdir(exist_ok=True)
        _write(Path(f.hostfile), "".join(f"{h}\n" for h in f.hosts))
        ssh = wd / "ssh"
        for key in ("id_ed25519", *(f"host_{h}" for h in f.hosts)):
            if not (ssh / key).exists():
                _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{self.prefix}-{key}",
                      "-f", str(ssh / key)], what=f"generating ssh key {key}")
        _write(ssh / "authorized_keys", (ssh / "id_ed25519.pub").read_text(), 0o600)
        known = "".join(f"{h},{a} {(ssh / f'host_{h}.pub').read_text().split(' ')[0]} "
                        f"{(ssh / f'host_{h}.pub').read_text().split(' ')[1]}\n"
                        for h, a in zip(f.hosts, f.addresses))
        _write(ssh / "known_hosts", known)
        _write(Path(f.ssh_config), ssh_config(list(f.hosts), list(f.addresses),
                                              ssh / "id_ed25519", ssh / "known_hosts"))
        for h, a in zip(f.hosts, f.addresses):
            _write(ssh / f"sshd_{h}.conf", sshd_config(
                address=a, host_key=ssh / f"host_{h}", authorized_keys=ssh / "authorized_keys",
                pid_file=ssh / f"sshd_{h}.pid"))
        # Hydra and users call plain `ssh`: a wrapper, first on the bed's PATH, adds -F.
        _write(Path(f.ssh), f'#!/bin/sh\nexec /usr/bin/ssh -F "{f.ssh_config}" "$@"\n', 0o755)

    def _spawn(self, name: str, argv: list[str], *, env: dict | None = None) -> subprocess.Popen:
        log = open(self.workdir / "log" / f"{name}.out", "ab")
        # marked, so that a test's check for leftover processes tells the bed's daemons (an
        # orphan goes to the nearest subreaper: a pytest worker that ran autotune is one)
        env = {**(os.environ if env is None else env), BED_ENV: str(self.workdir)}
        try:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                 env=env, start_new_session=True)
        finally:
            log.close()
        self._procs[name] = p
        self._save_state()
        return p

    def _fail(self, what: str, logs: list[Path]) -> BedError:
        tails = "\n".join(_tail(p) for p in logs)
        return BedError(f"{what}\n{tails}\nThe bed is being torn down; its files stay in "
                        f"{self.workdir} until the next up.")

    def _wait(self, what: str, condition, deadline: float, procs: list[str], logs: list[Path]):
        def ready():
            for name in procs:
                p = self._procs[name]
                if p.poll() is not None:
                    raise self._fail(f"{name} exited with {p.returncode} while waiting for {what}",
                                     logs)
            return condition()
        value = _poll(ready, timeout_s=max(0.0, deadline - time.monotonic()), poll_s=0.2)
        if not value:
            raise self._fail(f"timed out waiting for {what}", logs)
        return value

    def _start_munge(self, deadline: float) -> None:
        d = self.workdir / "munge"
        pw = pwd.getpwnam("munge")
        key = d / "munge.key"
        _write(key, "", 0o600)
        key.write_bytes(os.urandom(1024))
        for path in (d, key):
            os.chown(path, pw.pw_uid, pw.pw_gid)
        os.chmod(d, 0o755)
        sock = d / "munge.socket"
        self._spawn("munged", ["setpriv", "--reuid=munge", "--regid=munge", "--init-groups",
                               "/usr/sbin/munged", "--foreground",
                               f"--key-file={key}", f"--socket={sock}",
                               f"--pid-file={d / 'munged.pid'}", f"--log-file={d / 'munged.log'}",
                               f"--seed-file={d / 'munged.seed'}"])

        def works():
            if not sock.exists():
                return False
            return subprocess.run(["munge", "-n", "-S", str(sock)], capture_output=True,
                                  timeout=10).returncode == 0
        self._wait("munged's socket", works, deadline, ["munged"],
                   [d / "munged.log", self.workdir / "log/munged.out"])

    def _start_sshd(self, deadline: float) -> None:
        f = self._need_facts()
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
        ssh = self.workdir / "ssh"
        for h in f.hosts:
            # sshd re-executes itself, so it must be started by its absolute path
            self._spawn(f"sshd-{h}", self.on(h, [
                "/usr/sbin/sshd", "-D", "-f", str(ssh / f"sshd_{h}.conf"),
                "-E", str(self.workdir / "log" / f"sshd-{h}.log")]))
        first = f.hosts[0]

        def reaches(h):
            return self.run(first, ["ssh", h, "true"], timeout_s=15).returncode == 0
        for h in f.hosts:
            self._wait(f"ssh {h} from {first}", lambda h=h: reaches(h), deadline,
                       [f"sshd-{x}" for x in f.hosts],
                       [self.workdir / "log" / f"sshd-{x}.log" for x in f.hosts])

    def _start_slurm(self, deadline: float) -> None:
        f = self._need_facts()
        env = self.env()
        log = self.workdir / "slurm/log"
        logs = [log / "slurmctld.log", self.workdir / "log/slurmctld.out"]
        logs += [log / f"slurmd-{h}.log" for h in f.hosts]
        self._spawn("slurmctld", ["slurmctld", "-D", "-c", "-i", "-f", f.slurm_conf], env=env)
        for h in f.hosts:
            self._spawn(f"slurmd-{h}", self.on(h, ["slurmd", "-D", "-N", h, "-f", f.slurm_conf]),
                        env=env)

        def idle():
            p = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True,
                               text=True, env=env, timeout=15)
            states = dict(line.split() for line in p.stdout.splitlines() if line.strip())
            return p.returncode == 0 and all(states.get(h) == "idle" for h in f.hosts)
        self._wait("sinfo to show every node idle", idle, deadline,
                   ["slurmctld", *(f"slurmd-{h}" for h in f.hosts)], logs)

    # -- down
    def down(self) -> None:
        """Stop everything the bed started and delete what it made. Idempotent; never raises
        for what is already gone."""
        pids = {name: p.pid for name, p in self._procs.items()}
        if self._state_path().exists():
            try:
                pids.update(json.loads(self._state_path().read_text()).get("pids", {}))
            except (OSError, ValueError):
                pass
        namespaces = self._own_namespaces()
        # Processes: ours by pid (command line checked: pids are reused), then everything left
        # in the namespaces (job steps, ranks, ssh sessions), then stray daemons by command line.
        pids.update(pid_files(self.workdir))
        targets = [pid for pid in pids.values() if self._is_ours(pid)]
        for ns in namespaces:
            targets += self._ns_pids(ns)
        targets += bed_processes(self.workdir)
        self._kill(sorted(set(targets)))
        for p in self._procs.values():
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self._procs.clear()
        for ns in namespaces:
            left = self._ns_pids(ns)
            if left:
                self._kill(left)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        for link in self._own_links():
            subprocess.run(["ip", "link", "del", link], capture_output=True)
        etc_netns = Path("/etc/netns")
        for etc in etc_netns.glob(f"{self.prefix}-*") if etc_netns.exists() else []:
            shutil.rmtree(etc, ignore_errors=True)
        try:
            etc_netns.rmdir()  # only when no other bed (or anything else) uses it
        except OSError:
            pass
        uts = self.workdir / "uts"
        if uts.exists():
            for f in uts.iterdir():
                subprocess.run(["umount", str(f)], capture_output=True)
                f.unlink(missing_ok=True)
        self._state_path().unlink(missing_ok=True)

    def _is_ours(self, pid: int) -> bool:
        return pid != os.getpid() and _mentions(pid, self.workdir)

    def _own_namespaces(self) -> list[str]:
        p = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
        names = [line.split()[0] for line in p.stdout.splitlines() if line.strip()]
        return [n for n in names if n.startswith(f"{self.prefix}-node")]

    def _own_links(self) -> list[str]:
        p = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True)
        names = [line.split(":")[1].strip().split("@")[0] for line in p.stdout.splitlines()
                 if line.count(":") >= 2]
        return [n for n in names if n.startswith(f"{self.prefix}-")]

    @staticmethod
    def _ns_pids(ns: str) -> list[int]:
        p = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        return [int(x) for x in p.stdout.split() if x.isdigit() and int(x) != os.getpid()]

    @staticmethod
    def _kill(pids: list[int], grace_s: float = 5.0) -> None:
        """TERM, then KILL what is still alive after ``grace_s``."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            if not _poll(lambda: not any(alive(p) for p in pids), timeout_s=grace_s, poll_s=0.05):
                continue
            return

    def status(self) -> dict:
        """What is up now: namespaces, links, daemons alive, sinfo's node states."""
        out = {"workdir": str(self.workdir), "prefix": self.prefix,
               "namespaces": self._own_namespaces(), "links": self._own_links(),
               "daemons": sorted(bed_processes(self.workdir))}
        if self.facts and Path(self.facts.slurm_conf).exists():
            p = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True,
                               text=True, env=self.env(), timeout=15)
            out["sinfo"] = p.stdout.split("\n") if p.returncode == 0 else p.stderr.strip()
        return out


# ---------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="build the bed and print its facts as JSON")
    up.add_argument("--nodes", type=int, default=2)
    up.add_argument("--rate", default="1gbit", help="tbf rate of each link (1gbit, 100mbit...)")
    up.add_argument("--delay-ms", type=float, default=0.0, help="netem delay, where available")
    up.add_argument("--prefix", default="", help="namespace/link name prefix (default atb<pid>)")
    up.add_argument("--loopback-names", action="store_true",
                    help="each host's own name resolves to 127.0.1.1 on it, as Debian leaves it")
    for p in (up, sub.add_parser("down", help="tear the bed down (idempotent)"),
              sub.add_parser("status", help="what of the bed is up")):
        p.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "up":
            spec = BedSpec(nodes=args.nodes, rate=args.rate, delay_ms=args.delay_ms,
                           prefix=args.prefix, workdir=args.workdir.resolve(),
                           loopback_names=args.loopback_names)
            print(ClusterBed(spec).up().to_json())
        elif not (args.workdir / "bed.json").exists():
            print(json.dumps({"workdir": str(args.workdir), "up": False}))
        elif args.cmd == "down":
            ClusterBed.attach(args.workdir.resolve()).down()
        else:
            print(json.dumps(ClusterBed.attach(args.workdir.resolve()).status(), indent=2))
    except ValueError as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return 2
    except BedError as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
