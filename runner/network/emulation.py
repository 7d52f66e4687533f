"""Nodes on emulated links, on one Linux host (`hardware.emulate_network.enabled`).

Each node's ranks run in a network namespace of their own. The namespaces are joined by veth
pairs through a bridge in a namespace of its own (the switch), and each node's egress is shaped by
a token bucket (`tc ... tbf`) to the profile's `inter_node.bandwidth_gbs`; the profile's latency
is added where the kernel has the `netem` queueing discipline (where it has not, the run says so
and goes on with the rate alone). Ranks of one node reach each other on their namespace's own
loopback: unshaped, as a node's own links are. Addresses come from 198.18.0.0/15, the range set
aside for benchmarking networks (RFC 2544), inside the namespaces the run made: nothing outside
them is ever addressed. The namespaces are named for the launcher's process and removed on every
exit; ones left by a launcher that was killed (SIGKILL: no clean-up runs) are removed at the next
start.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from runner.errors import ConfigError, Stopped, require

KEY = "hardware.emulate_network"
PREFIX = "runner-"  # every namespace a run makes: runner-<launcher pid>-<node or "sw">
SUBNET = "198.18.0"  # node n at 198.18.0.(n+1)/24
PORT = 29500  # the ranks' rendezvous store, on node 0's address
LINK = "eth0"  # each node's link, in its namespace
CLONE_NEWNET = 0x40000000
MADE: set[str] = set()  # the namespaces this process made and has not removed
QUEUE_BYTES = 4 * 2**20  # a link's queue at least: Linux's largest TCP send buffer (tcp_wmem)
NETNS_DIR = "/var/run/netns"  # where `ip netns add` keeps a namespace (iproute2's NETNS_RUN_DIR)
# Root of a user namespace of one's own, unprivileged, where the kernel allows one
UNSHARE = "unshare --user --map-root-user --net --mount python -m runner"
own_namespaces_ready = False  # in a user namespace: NETNS_DIR private, loopback up


@dataclass(frozen=True)
class Network:
    """The emulated network of one run: what the launcher builds and each rank enters."""

    key: str  # runner-<launcher pid>
    nodes: int
    per_node: int  # ranks on each node
    rate_bits: int  # each node's egress, bits/s
    latency_us: float
    slow: tuple[int, ...] = ()  # nodes whose egress is shaped to slow_share of rate_bits
    slow_share: float = 1.0

    def namespace(self, node: int) -> str:
        return f"{self.key}-n{node}"

    @property
    def switch(self) -> str:
        return f"{self.key}-sw"

    def address(self, node: int) -> str:
        return f"{SUBNET}.{node + 1}"

    def names(self) -> list[str]:
        return [self.switch, *(self.namespace(n) for n in range(self.nodes))]

    def rate_of(self, node: int) -> int:
        """A node's egress, bits/s: a slow node's a share of the others'."""
        return round(self.rate_bits * self.slow_share) if node in self.slow else self.rate_bits


def network_of(hw: Any) -> Network:
    """The network a job's hardware asks for, named for this process."""
    link = hw.inter_node
    return Network(
        key=f"{PREFIX}{os.getpid()}",
        nodes=hw.nodes,
        per_node=hw.devices,
        rate_bits=round(link.bandwidth_gbs * 8e9),
        latency_us=link.latency_us,
        slow=tuple(hw.emulate_network.slow_nodes),
        slow_share=hw.emulate_network.slow_share,
    )


def check_emulation(cfg: Any, launched: bool) -> None:
    """What emulating the links needs, refused in one line before anything is made."""
    hw = cfg.hardware
    require(
        hw.nodes > 1,
        KEY,
        f"emulates the links between nodes: needs hardware.nodes > 1, got {hw.nodes}",
    )
    require(
        not launched,
        KEY,
        "the runner starts every node's ranks itself: run it without torchrun or srun",
    )
    require(
        hw.accelerator == "cpu",
        KEY,
        "GPUs on one host reach each other over their own links, not the emulated ones: "
        "hardware.accelerator=cpu",
    )
    uri = str(cfg.logger.tracking_uri)
    require(
        uri.startswith(("sqlite:", "file:")) or "://" not in uri,
        KEY,
        f"ranks run inside network namespaces, where {uri} is out of reach: use a sqlite:/// "
        "or file store",
    )
    require(platform.system() == "Linux", KEY, "needs Linux's network namespaces")
    tools = [t for t in ("ip", "tc") if shutil.which(t) is None]
    require(
        not tools, KEY, f"needs iproute2's {' and '.join(tools)} on PATH (apt-get install iproute2)"
    )
    require(os.geteuid() == 0, KEY, without_root())


def without_root() -> str:
    """What a user who is not root can do: be root of a user namespace of their own, where the
    kernel allows one (unprivileged; its own network and mount namespaces with it)."""
    need = "making network namespaces and shaping links needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN)"
    if user_namespaces_allowed():
        return f"{need}: run as root, or as root of a user namespace of your own: {UNSHARE} ..."
    return f"{need}: run as root (this kernel allows no user namespaces: user.max_user_namespaces)"


def user_namespaces_allowed() -> bool:
    try:
        return int(Path("/proc/sys/user/max_user_namespaces").read_text()) > 0
    except (OSError, ValueError):
        return False


def in_user_namespace() -> bool:
    """Whether this process is root of a user namespace of its own (unshare --user
    --map-root-user), not the host's: its uid map is not the whole of the host's."""
    try:
        return Path("/proc/self/uid_map").read_text().split() != ["0", "0", "4294967295"]
    except OSError:
        return False


def make_own_namespaces_usable() -> None:
    """As root of a user namespace (UNSHARE): the host's /var/run/netns is not its to write, so a
    private tmpfs over it, in the mount namespace that goes with the process; and its network
    namespace's loopback up (a new one starts down), where the launcher's store listens. Once a
    process: a sweep's later jobs find both."""
    global own_namespaces_ready
    if own_namespaces_ready or not in_user_namespace():
        return
    # Where no namespace was ever made the folder is missing, and its parent is not ours to write
    private = NETNS_DIR if os.path.isdir(NETNS_DIR) else os.path.dirname(NETNS_DIR)
    for command in (
        ["mount", "-t", "tmpfs", "runner-netns", private],
        ["ip", "link", "set", "lo", "up"],
    ):
        done = run(command)
        if done.returncode != 0:
            raise ConfigError(
                KEY,
                f"in a user namespace it needs network and mount namespaces of its own too "
                f"({UNSHARE}): {why(command, done)}",
            )
    own_namespaces_ready = True


def build_commands(net: Network) -> list[list[str]]:
    """The ip commands that make the namespaces, the switch and each node's link (pure)."""
    out = [["ip", "netns", "add", name] for name in net.names()]
    out += [
        ["ip", "-n", net.switch, "link", "add", "br0", "type", "bridge"],
        ["ip", "-n", net.switch, "link", "set", "br0", "up"],
    ]
    for node in range(net.nodes):
        ns, port = net.namespace(node), f"p{node}"
        out += [
            ["ip", "link", "add", LINK, "netns", ns, "type", "veth", "peer", "name", port,
             "netns", net.switch],
            ["ip", "-n", net.switch, "link", "set", port, "master", "br0"],
            ["ip", "-n", net.switch, "link", "set", port, "up"],
            ["ip", "-n", ns, "addr", "add", f"{net.address(node)}/24", "dev", LINK],
            ["ip", "-n", ns, "link", "set", LINK, "up"],
            ["ip", "-n", ns, "link", "set", "lo", "up"],
        ]  # fmt: skip
    return out


def shaping(net: Network, node: int, delay: bool) -> list[list[str]]:
    """A node's egress: the link's token bucket, under a netem delay where `delay`."""
    tc = ["tc", "-n", net.namespace(node), "qdisc", "add", "dev", LINK]
    if not delay:
        return [[*tc, "root", *bucket(net.rate_of(node))]]
    return [
        [*tc, "root", "handle", "1:", "netem", "delay", f"{net.latency_us:g}us"],
        [*tc, "parent", "1:1", "handle", "10:", *bucket(net.rate_of(node))],
    ]


def bucket(rate_bits: int) -> list[str]:
    """The token bucket at the link's rate: 1 ms of the rate, at least 16 KiB, as its burst (with
    a frame or two every frame waits for the qdisc's timer, which a busy host fires late: gloo
    then delivered 0.84 of 20 Mbit/s beside the suite's other tests). Its queue: 100 ms of the
    rate, at least TCP's largest send buffer (tcp_wmem's 4 MiB), so that a lone flow's window is
    never dropped: a 100 ms queue at 20 Mbit/s (250 kB) dropped gloo's, which then delivered 0.76
    of the rate rather than 0.92."""
    burst = max(rate_bits // 8 // 1000, 16384)
    queue = max(rate_bits // 8 // 10, QUEUE_BYTES)
    return ["tbf", "rate", f"{rate_bits}bit", "burst", str(burst), "limit", str(queue)]


def run(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, check=False)


def failed(command: list[str], done: subprocess.CompletedProcess) -> ConfigError:
    return ConfigError(KEY, why(command, done))


def why(command: list[str], done: subprocess.CompletedProcess) -> str:
    said = (done.stderr or done.stdout).strip().splitlines()
    return f"`{' '.join(command)}` failed: {said[0] if said else done.returncode}"


def has_netem(net: Network) -> bool:
    """Whether this kernel has netem: tried on node 0's link, and taken off again."""
    trial = shaping(net, 0, delay=True)[0]
    if run(trial).returncode != 0:
        return False
    run(["tc", "-n", net.namespace(0), "qdisc", "del", "dev", LINK, "root"])
    return True


def build(net: Network) -> bool:
    """Make the network; whether the latency is applied too (netem). On any failure what this
    made is removed (a namespace of the same name that was there already is not) and the failure
    raised in one line."""
    made: list[str] = []
    try:
        for command in build_commands(net):
            checked(command)
            if command[:3] == ["ip", "netns", "add"]:
                made.append(command[3])
                MADE.add(command[3])
        delay = net.latency_us > 0 and has_netem(net)
        for node in range(net.nodes):
            for command in shaping(net, node, delay):
                checked(command)
    except BaseException:
        remove(made)
        raise
    return delay


def checked(command: list[str]) -> None:
    done = run(command)
    if done.returncode != 0:
        raise failed(command, done)


def remove(names: list[str]) -> None:
    """Delete these namespaces (their links and bridge go with them); absent ones are skipped."""
    for name in names:
        run(["ip", "netns", "delete", name])
        MADE.discard(name)


def namespaces() -> list[str]:
    done = run(["ip", "netns", "list"])
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


def stale() -> list[str]:
    """Namespaces of launchers that are gone: killed before their clean-up ran."""
    out = []
    for name in namespaces():
        pid = name.removeprefix(PREFIX).split("-")[0]
        if name.startswith(PREFIX) and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            out.append(name)
    return out


@contextlib.contextmanager
def emulated(cfg: Any) -> Iterator[Network | None]:
    """The job's emulated network while the body runs (None where it emulates none), its latency
    0 where the kernel could not apply it; removed on every way out, a SIGTERM's included."""
    if not cfg.hardware.emulate_network.enabled:
        yield None
        return
    net = network_of(cfg.hardware)
    make_own_namespaces_usable()
    # Left by a launcher that is gone, or by an earlier job of this process (a sweep's)
    remove([*stale(), *(MADE & set(namespaces()))])
    with sigterm_raises():
        try:
            delay = build(net)
            if not delay and net.latency_us > 0:
                latency = f"without the {net.latency_us:g} us of latency (no netem here)"
                net = replace(net, latency_us=0.0)
            else:
                latency = f"{net.latency_us:g} us of latency" if delay else "no latency"
            slow = "".join(f", node {n}'s to {net.rate_of(n) / 1e6:g} Mbit/s" for n in net.slow)
            print(
                f"{KEY}: {net.nodes} nodes of {net.per_node} rank(s) in namespaces {net.key}-n*, "
                f"links shaped to {net.rate_bits / 1e6:g} Mbit/s{slow}, {latency}",
                flush=True,
            )
            yield net
        finally:  # what this made: a namespace of the same name that was there stays
            remove([name for name in net.names() if name in MADE])


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """SIGTERM raised as an exception while the body runs (on the main thread, where a handler
    can be set), so that the clean-up runs; the handler before it put back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def terminated(signum: int, _: Any) -> None:
    """SIGTERM while the network is up: raised, so that it is removed on the way out."""
    raise Stopped(f"got signal {signum} ({signal.Signals(signum).name})")


def link_params(net: Network | None) -> dict[str, str]:
    """What MLflow records of the emulated link: its rate, and its latency or none."""
    if net is None:
        return {}
    latency = f"{net.latency_us:g}" if net.latency_us else "none"
    params = {
        "emulated_link.rate_mbit": f"{net.rate_bits / 1e6:g}",
        "emulated_link.latency_us": latency,
    }
    if net.slow:
        params["emulated_link.slow_nodes"] = ",".join(map(str, net.slow))
        params["emulated_link.slow_rate_mbit"] = f"{net.rate_of(net.slow[0]) / 1e6:g}"
    return params


def enter(net: Network, rank: int) -> None:
    """In a rank, before its process group forms: into its node's namespace, with the rendezvous
    on node 0's address and gloo on the node's link."""
    node = rank // net.per_node
    with open(f"{NETNS_DIR}/{net.namespace(node)}") as handle:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(handle.fileno(), CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {net.namespace(node)} failed")
    os.environ.update(
        MASTER_ADDR=net.address(0),
        MASTER_PORT=str(PORT),
        TORCHELASTIC_USE_AGENT_STORE="False",  # the launcher's store is out of reach
        GLOO_SOCKET_IFNAME=LINK,
        # one launcher started every node's ranks: each is told its node, as torchrun's would be
        LOCAL_RANK=str(rank % net.per_node),
        LOCAL_WORLD_SIZE=str(net.per_node),
        GROUP_RANK=str(node),
        GROUP_WORLD_SIZE=str(net.nodes),
        NODE_RANK=str(node),
    )
