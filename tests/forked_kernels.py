"""Jupyter kernels forked from a warm process, for the browser test (tests/test_browser.py).

The browser test checks the frontend: each lesson gets a fresh kernel, Run All and every slider.
A fresh kernel process imports torch, matplotlib, ipywidgets, the helpers and the frameworks
again, about 3 CPU-s a lesson before its first line runs. Here a zygote imports them once and
forks each kernel from itself, as `make check` runs its notebooks (conftest.py):

- `python tests/forked_kernels.py zygote SOCKET`: imports what the notebooks import, then serves
  on the Unix socket SOCKET. For each request it forks a child that takes the client's standard
  streams, environment and folder, a fresh interpreter's warning filters, and runs a real
  `IPKernelApp` (ipykernel) on the client's connection file.
- `python tests/forked_kernels.py client -f CONNECTION_FILE`: the kernelspec's argv. It asks the
  zygote (the socket in LESSONS_KERNEL_ZYGOTE) for a kernel, passes on the signals Jupyter sends
  it (interrupt, terminate), and exits when the kernel does. The kernel exits when its client
  does, however it ended, so no kernel outlives its session.

What a kernel a learner gets has and this one lacks: import-time warnings (the zygote imported
quietly), which nbval's fresh kernels in `make test` see.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import sys
import time

_STREAMS = 3  # stdin, stdout, stderr


def client(argv: list[str]) -> int:
    """Start a kernel forked by the zygote; wait for it and pass signals on. Return its status."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    deadline = time.monotonic() + 180
    while True:  # the zygote may still be importing
        try:
            sock.connect(os.environ["LESSONS_KERNEL_ZYGOTE"])
            break
        except (FileNotFoundError, ConnectionRefusedError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    request = {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "client": os.getpid()}
    socket.send_fds(sock, [json.dumps(request).encode()], list(range(_STREAMS)))
    pid = int(sock.recv(64).decode())
    sock.close()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, lambda s, _frame: _send(pid, s))
    kernel = os.pidfd_open(pid)
    while True:
        try:
            if select.select([kernel], [], [])[0]:
                return 0
        except InterruptedError:
            continue


def _send(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def zygote(path: str) -> None:
    """Import what the lessons import, then fork a kernel for each client that connects."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root))
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")  # as ipykernel sets it
    from conftest import COMMON_IMPORTS, _import_quietly, code_cells, imported_modules  # the root conftest

    notebooks = sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    names = [name for nb in notebooks for name in imported_modules(code_cells(nb))]
    _import_quietly(("ipykernel.kernelapp", *COMMON_IMPORTS, *dict.fromkeys(names)))
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # kernels are reaped as they exit
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen()
    while True:
        conn, _ = server.accept()
        data, fds, _, _ = socket.recv_fds(conn, 1 << 20, _STREAMS)
        request = json.loads(data)
        pid = os.fork()
        if pid == 0:
            server.close()
            _kernel(conn, fds, request)
        conn.close()
        for fd in fds:
            os.close(fd)


def _kernel(conn: socket.socket, fds: list[int], request: dict) -> None:
    """In the forked child: the client's surroundings, then a real ipykernel until it exits."""
    import threading

    from helpers.distributed.processes import (
        _fresh_warning_filters,  # as make check's forked notebooks get them
    )

    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        _fresh_warning_filters()
        conn.sendall(str(os.getpid()).encode())
        conn.close()
        client_fd = os.pidfd_open(request["client"])

        def exit_with_client() -> None:  # Jupyter may kill the client: the kernel goes with it
            select.select([client_fd], [], [])
            os._exit(0)

        threading.Thread(target=exit_with_client, daemon=True).start()
        from ipykernel.kernelapp import IPKernelApp

        sys.argv = ["ipykernel_launcher", *request["argv"]]
        IPKernelApp.launch_instance(argv=request["argv"])
        code = 0
    finally:
        os._exit(code)


if __name__ == "__main__":
    if sys.argv[1:2] == ["zygote"]:
        zygote(sys.argv[2])
    elif sys.argv[1:2] == ["client"]:
        sys.exit(client(sys.argv[2:]))
    else:
        sys.exit("usage: forked_kernels.py zygote SOCKET | client -f CONNECTION_FILE")
