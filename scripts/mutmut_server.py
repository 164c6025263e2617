"""A fork server that runs pytest for mutmut without paying for `import torch` on every mutant.

`make mutate` (scripts/mutate.sh) starts `python scripts/mutmut_server.py serve SOCKET` once, in
the throw-away copy of the repository that mutmut edits. The server imports torch, pytest and
matplotlib (never `helpers`), then waits. mutmut's runner is
`python scripts/mutmut_server.py run SOCKET -- PYTEST_ARGS`: a client without torch that asks the
server to fork; the child imports the (mutated) helpers from disk, runs `pytest.main(PYTEST_ARGS)`
and its exit status becomes the client's. Bytecode caching is off, so a mutant that keeps the
file's size and mtime second is never served from a stale .pyc. Plugin autoload is off
(the unit tests use none; nbval's import alone costs seconds).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys

CHILD_TIMEOUT_S = 300  # a mutant that loops forever is killed (and counts as killed)


def serve(path: str) -> None:
    sys.dont_write_bytecode = True
    os.environ.setdefault("MPLBACKEND", "Agg")
    # The unit tests need no plugin; loading nbval's (nbformat, jsonschema) costs seconds per child.
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    # Imported once, for every child: whatever the tests import that is not `helpers`.
    import matplotlib.pyplot  # noqa: F401
    import numpy  # noqa: F401
    import pytest  # noqa: F401
    import torch  # noqa: F401
    import torch.distributed._tools.mem_tracker  # noqa: F401
    import torch.utils.checkpoint  # noqa: F401
    import torch.utils.flop_counter  # noqa: F401

    if os.path.exists(path):
        os.unlink(path)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    while True:
        conn, _ = srv.accept()
        with conn:
            request = json.loads(conn.makefile().readline())
            if request.get("stop"):
                return
            conn.sendall(f"{_run_child(request['args'])}\n".encode())


def _run_child(args: list[str]) -> int:
    pid = os.fork()
    if pid == 0:  # the child: fresh helpers, the mutated file included
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            import pytest

            os._exit(int(pytest.main(args)))
        finally:
            os._exit(3)
    signal.signal(signal.SIGALRM, lambda *_: os.kill(pid, signal.SIGKILL))
    signal.alarm(CHILD_TIMEOUT_S)
    _, status = os.waitpid(pid, 0)
    signal.alarm(0)
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1


def run(path: str, args: list[str]) -> int:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
        c.connect(path)
        c.sendall((json.dumps({"args": args}) + "\n").encode())
        return int(c.makefile().readline())


def stop(path: str) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
        c.connect(path)
        c.sendall(b'{"stop": true}\n')


if __name__ == "__main__":
    cmd, sock, *rest = sys.argv[1:]
    if cmd == "serve":
        serve(sock)
    elif cmd == "stop":
        stop(sock)
    else:
        sys.exit(run(sock, rest[1:] if rest[:1] == ["--"] else rest))
