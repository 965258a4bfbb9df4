"""Multi-node start-up checks that fail fast, naming IP:port, instead of hanging in rendezvous.

Run by ``accel launch`` on every machine of a job with ``--num_machines > 1``, before torchrun:

- resolve ``--main_process_ip`` and report the address used;
- machine rank 0: the address must belong to this machine (the rendezvous store is hosted
  here; it also catches a second "machine rank 0") and the port must be free;
- other machines: connect to ``IP:port`` until a deadline (machine rank 0 may start a little
  later), then register this machine rank in the rendezvous store: a rank claimed twice, or a
  different ``--num_machines`` / processes per machine than another machine's, is an error;
- pick the network interface that reaches machine rank 0 and give it to gloo
  (``GLOO_SOCKET_IFNAME``) unless the user set it: gloo otherwise binds the address that the
  host name resolves to, often ``127.0.1.1``, and the other machines cannot connect.

Nothing here imports torch at module import time.

Example:
    >>> interface_of("127.0.0.1")
    'lo'
"""

from __future__ import annotations

import errno
import fcntl
import socket
import struct
import sys
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import TextIO

from .._base.parse import parse_float
from ..env import gloo_socket_ifname
from .errors import CLIError
from .settings import LaunchSettings

__all__ = ["DEFAULT_CONNECT_SECONDS", "connect_seconds", "interface_of", "preflight"]

#: How long a machine waits for machine rank 0's rendezvous port to accept connections.
DEFAULT_CONNECT_SECONDS = 120.0
_SIOCGIFADDR = 0x8915
_FATAL_CONNECT = (errno.EACCES, errno.EPERM, errno.EAFNOSUPPORT)


def interface_of(ip: str) -> str | None:
    """The name of the local network interface that has IPv4 address ``ip`` (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR,
                                  struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on this interface
                continue
            if socket.inet_ntoa(raw[20:24]) == ip:
                return name
    return None


def _resolve(host: str, port: int) -> str:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise CLIError(f"--main_process_ip {host!r} cannot be resolved ({exc.strerror}); pass "
                       "the IP address of machine rank 0 as the other machines reach it") from None
    ipv4 = [info for info in infos if info[0] == socket.AF_INET]
    return str((ipv4 or infos)[0][4][0])


def _check_host(ip: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((ip, 0))  # only an address of this machine can be bound
        except OSError:
            raise CLIError(
                f"this machine was started as machine rank 0, which hosts the rendezvous at "
                f"{ip}:{port}, but {ip} is not an address of this machine "
                f"({socket.gethostname()}); start machine rank 0 on the machine that owns "
                "--main_process_ip, give each machine its own --machine_rank, or fix "
                "--main_process_ip") from None
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))  # the store listens on every address of this machine
        except OSError as exc:
            raise CLIError(f"the rendezvous port {port} is already in use on machine rank 0 "
                           f"({exc.strerror}): another job, or a previous run still shutting "
                           "down, holds it; pass another --main_process_port") from None


def _connect(ip: str, *, port: int, deadline: float, out: TextIO, rank: int) -> str:
    """Connect to ``ip:port`` until ``deadline``; returns the local address used."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    start, last_note, reason = time.monotonic(), time.monotonic(), ""
    while True:
        try:
            with socket.create_connection((ip, port), timeout=5.0) as sock:
                return str(sock.getsockname()[0])
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            if exc.errno in _FATAL_CONNECT or family not in (socket.AF_INET, socket.AF_INET6):
                break
        now = time.monotonic()
        if now >= deadline:
            break
        if now - last_note >= 10.0:
            last_note = now
            print(f"accel launch: machine {rank}: still waiting for machine rank 0 at "
                  f"{ip}:{port} ({reason}; {now - start:.0f} s)", file=out, flush=True)
        time.sleep(min(0.5, max(deadline - now, 0.0)))
    raise CLIError(f"machine rank 0's rendezvous at {ip}:{port} is not reachable from this "
                   f"machine ({reason}) after {time.monotonic() - start:.0f} s; check that "
                   f"`accel launch --machine_rank 0` runs on {ip}, that --main_process_ip/--"
                   "main_process_port are the same on every machine, and that no firewall "
                   "blocks the port")


def _register(settings: LaunchSettings, ip: str, deadline: float) -> None:
    """Claim this machine rank in machine rank 0's store; compare the job layout."""
    from torch.distributed import TCPStore  # only here: connecting needs torch

    s = settings
    store = TCPStore(ip, s.main_process_port, is_master=False, wait_for_workers=False,
                     timeout=timedelta(seconds=max(5.0, deadline - time.monotonic())))
    host = socket.gethostname()
    claims = store.add(f"accel/preflight/machine/{s.machine_rank}", 1)
    store.set(f"accel/preflight/machine/{s.machine_rank}/{claims}", host)
    if claims > 1:
        first = store.get(f"accel/preflight/machine/{s.machine_rank}/1").decode(errors="replace")
        raise CLIError(f"machine rank {s.machine_rank} was claimed twice (by {first} first, then "
                       f"by this machine, {host}); give every machine its own --machine_rank "
                       f"0..{s.num_machines - 1}")
    mine = f"{s.num_machines} machines x {s.nproc_per_node} processes"
    seen = store.compare_set("accel/preflight/layout", "", mine).decode(errors="replace")
    if seen != mine:
        raise CLIError(f"this machine was started with {mine} (--num_machines "
                       f"{s.num_machines}, -n {s.num_processes}) but another machine with "
                       f"{seen}; pass the same --num_machines and -n/--num_processes everywhere")


def connect_seconds(rdzv_conf: str) -> float:
    """The connect deadline: ``join_timeout`` of ``--rdzv_conf`` if given, else the default.

    Example:
        >>> connect_seconds("join_timeout=30,read_timeout=60")
        30.0
    """
    for item in rdzv_conf.split(","):
        key, _, value = item.partition("=")
        if key.strip() == "join_timeout":
            try:
                return parse_float(value, name="join_timeout", above=0)
            except ValueError:
                raise CLIError(f"--rdzv_conf join_timeout={value.strip()!r} must be a number of "
                               "seconds > 0") from None
    return DEFAULT_CONNECT_SECONDS


def preflight(settings: LaunchSettings, environ: Mapping[str, str] | None = None,
              out: TextIO = sys.stderr) -> dict[str, str]:
    """Check a multi-node start-up; returns environment additions for the workers.

    ``environ`` is the launcher's environment (None: this process's).

    Machines other than rank 0 wait for machine rank 0's port for ``--rdzv_conf
    join_timeout=S`` seconds (default 120).

    Raises:
        CLIError: naming the address, port or setting at fault.
    """
    s = settings
    if s.num_machines <= 1 or s.rdzv_backend not in ("static", "c10d"):
        return {}
    ip = _resolve(s.main_process_ip, s.main_process_port)
    shown = ip if ip == s.main_process_ip else f"{ip} (resolved from {s.main_process_ip!r})"
    deadline = time.monotonic() + connect_seconds(s.rdzv_conf)
    if s.machine_rank == 0:
        if s.rdzv_backend == "static":
            _check_host(ip, s.main_process_port)
        local, note = ip, f"hosting the rendezvous on {shown}:{s.main_process_port}"
    else:
        local = _connect(ip, port=s.main_process_port, deadline=deadline, out=out,
                         rank=s.machine_rank)
        _register(s, ip, deadline)
        note = f"machine rank 0 at {shown}:{s.main_process_port} reached from {local}"
    env: dict[str, str] = {}
    interface, yours = interface_of(local), gloo_socket_ifname(environ)
    if interface and not yours:
        env["GLOO_SOCKET_IFNAME"] = interface
        note += f"; gloo uses interface {interface}"
    elif yours:
        note += f"; gloo uses GLOO_SOCKET_IFNAME={yours} (yours)"
    print(f"accel launch: machine {s.machine_rank} of {s.num_machines}: {note}",
          file=out, flush=True)
    return env
