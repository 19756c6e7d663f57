"""Where the backends' processes meet: a store and connections on the loopback interface only.

A torch.distributed world needs a rendezvous store, and each backend then opens its
own connections between the ranks. Left to torch, both listen beyond this machine:
``TCPStore`` listens on every interface (``*:PORT`` or ``[::]:PORT``) whatever host
name it is given, gloo binds its connections to the address the machine's host name
resolves to, and NCCL's bootstrap to the first interface that is not loopback. The
store is unauthenticated: anyone who can reach the port can read and write it.

Every rank of these backends is a process on this machine, so nothing needs to be
reachable from elsewhere. Here:

* the parent binds a socket to ``127.0.0.1`` itself, on a port the OS picks, and
  serves the store on it (:class:`Rendezvous`, ``TCPStore(master_listen_fd=...)``);
  the workers connect to it as clients (:func:`join_world`), so no rank listens for
  the store and no port is chosen first and bound later (no race for it);
* in each worker, gloo's and NCCL's connections are pinned to the loopback
  interface (``GLOO_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME`` in the worker's own
  environment, set before the world starts: torch takes no argument for either);
* a worker closes its copy of the parent's listening socket, inherited through
  ``fork``, before anything else.

There is no multi-machine mode: ``torch_dist.run``, ``run_ranked``, ``measure``,
``profile_ops`` and ``ir.calibrate`` start their ranks here and nowhere else. To run
ranks on several machines, launch them yourself (``torchrun`` with a rendezvous
endpoint you choose and protect) on the ranked programs that
``ir.sharding.lower_to_ranks`` makes; strategy search across machines goes through a
Dask client you configure (``ir.search.search(..., executor=client)``,
docs/search.md).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
from pathlib import Path
from typing import Any

LOOPBACK = "127.0.0.1"
_IFF_LOOPBACK = 0x8  # Linux's interface flag (include/uapi/linux/if.h)


def loopback_interface() -> str:
    """The name of this machine's loopback interface (``lo`` on Linux), read from
    ``/sys/class/net``; ``lo`` where that cannot be read."""
    try:
        names = sorted(name for _, name in socket.if_nameindex())
    except OSError:
        return "lo"
    for name in names:
        try:
            flags = int((Path("/sys/class/net") / name / "flags").read_text().strip(), 16)
        except (OSError, ValueError):
            continue
        if flags & _IFF_LOOPBACK:
            return name
    return "lo"


def loopback_environment() -> dict[str, str]:
    """The environment variables that pin gloo's and NCCL's sockets to loopback."""
    interface = loopback_interface()
    return {"GLOO_SOCKET_IFNAME": interface, "NCCL_SOCKET_IFNAME": interface}


class Rendezvous:
    """The parent's side of a world: a socket bound to ``127.0.0.1`` (``port``), and,
    once :meth:`serve` is called, the ``TCPStore`` on it that the workers join.

    Make it before forking the workers (they take ``address``), call :meth:`serve` once
    they are started (no store thread is running when the parent forks), and
    :meth:`close` it when the run ends (a ``with`` block does)::

        with Rendezvous(world_size, timeout_s) as world:
            ...start workers with world.address...
            world.serve()
            ...wait for them...
    """

    def __init__(self, world_size: int, timeout_s: float) -> None:
        import torch.distributed  # noqa: F401  (imported once here, inherited by forks)

        self.world_size, self.timeout_s = world_size, timeout_s
        self._socket: socket.socket | None = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self._socket.bind((LOOPBACK, 0))
            self._socket.listen(max(128, world_size))
        except OSError:
            self._socket.close()
            raise
        self.port: int = self._socket.getsockname()[1]
        self.listen_fd: int = self._socket.fileno()
        self._store: Any = None

    @property
    def address(self) -> tuple[int, int]:
        """What a worker needs to join: (port, the listening socket's fd it inherits)."""
        return self.port, self.listen_fd

    def serve(self) -> Any:
        """Start serving the store on the bound socket (the store takes the socket over)."""
        import torch.distributed as dist

        if self._store is None:
            sock, self._socket = self._socket, None
            assert sock is not None
            self._store = dist.TCPStore(
                LOOPBACK,
                self.port,
                self.world_size,
                True,
                timeout=datetime.timedelta(seconds=self.timeout_s),
                wait_for_workers=False,
                master_listen_fd=sock.detach(),
            )
        return self._store

    def close(self) -> None:
        """Stop serving and close the socket."""
        self._store = None  # the store's destructor stops its server and closes the socket
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def __enter__(self) -> Rendezvous:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def join_world(
    address: tuple[int, int],
    rank: int,
    world_size: int,
    *,
    backend: str = "gloo",
    timeout_s: float = 120.0,
    **options: Any,
) -> None:
    """In a worker: join the world the parent's :class:`Rendezvous` at ``address`` serves,
    as ``rank`` of ``world_size``, with every socket on loopback (module doc).
    ``options`` go to ``torch.distributed.init_process_group`` (``device_id``)."""
    port, inherited_fd = address
    with contextlib.suppress(OSError):  # not inherited: a process started otherwise
        os.close(inherited_fd)  # the parent's listening socket, inherited through fork
    os.environ.update(loopback_environment())
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(LOOPBACK, port, world_size, False, timeout=timeout)
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=world_size, timeout=timeout, **options
    )


__all__ = ["LOOPBACK", "Rendezvous", "join_world", "loopback_environment", "loopback_interface"]
