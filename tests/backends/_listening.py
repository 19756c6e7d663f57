"""The TCP sockets that a process and its descendants listen on, read from /proc (Linux):
for the tests that no run of the torch backend listens beyond loopback."""

from __future__ import annotations

import ipaddress
import threading
import time
from pathlib import Path


def descendants(pid: int) -> list[int]:
    """``pid``'s children, their children, ... (those alive now)."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            found += children
            todo += children
    return found


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = fd.readlink().name
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address of /proc/net/tcp{,6}: 32-bit words in host (little-endian) order."""
    raw = bytes.fromhex(hex_address)
    words = [raw[i : i + 4][::-1] for i in range(0, len(raw), 4)]
    return ipaddress.ip_address(b"".join(words))


def listening(pids: list[int]) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket the processes ``pids`` listen on."""
    inodes = set().union(*(_socket_inodes(p) for p in pids)) if pids else set()
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], int(fields[9])
            if state == "0A" and inode in inodes:  # TCP_LISTEN
                host, port = local.split(":")
                out.add((str(_address(host)), int(port, 16)))
    return out


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


class ListenWatch:
    """Samples, every ``period_s`` on a thread, the sockets this process and its
    descendants listen on, while the ``with`` block runs (``seen``: all of them)."""

    def __init__(self, pid: int, period_s: float = 0.02) -> None:
        self.pid, self.period_s = pid, period_s
        self.seen: set[tuple[str, int]] = set()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.seen |= listening([self.pid, *descendants(self.pid)])
            self.samples += 1
            time.sleep(self.period_s)

    def __enter__(self) -> ListenWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def beyond_loopback(self) -> list[tuple[str, int]]:
        return sorted(s for s in self.seen if not is_loopback(s[0]))
