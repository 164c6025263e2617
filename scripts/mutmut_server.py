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

import contextlib
import gc
import json
import os
import signal
import socket
import sys
import tempfile

# A mutant that hangs is killed (and counts as killed). A module's test files take 5 to 30 s idle,
# but mutmut's baseline runs all of them in one child, which on a busy 2-core machine took over 30 s
# (test_preset_profiles, test_profiler, test_cli) and made the whole module's run fail.
CHILD_TIMEOUT_S = int(os.environ.get("MUTATE_CHILD_TIMEOUT_S", "150"))


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

    # Everything imported so far lives as long as the server: keep it out of every collection a
    # child makes (pytest's own gc.collect() at exit cost half a second a mutant without this).
    gc.collect()
    gc.freeze()

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
            verdict = _run_child(request["args"])
            # OSError: mutmut gave up on this mutant (its own timeout) and closed the client.
            with contextlib.suppress(OSError):
                conn.sendall(f"{verdict}\n".encode())


def _run_child(args: list[str]) -> int:
    """Run pytest in a forked child; return mutmut's verdict: 0 survived, 1 killed.

    pytest's exit status 1 (a test failed), 2 (a test module failed to import) and 3 (internal
    error) kill the mutant, and so does a child that hangs past CHILD_TIMEOUT_S, or 4 after a test
    module failed to import (the selected node ids are then "not found"). Any other 4 (usage
    error: a node id that does not exist) and 5 (no test ran) are written to
    `mutmut_problems.log` with the output's tail, so a test-selection bug cannot hide.
    """
    fd, log_path = tempfile.mkstemp(prefix="mutmut-child-", suffix=".log")
    pid = os.fork()
    if pid == 0:  # the child: fresh helpers, the mutated file included
        try:
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            import pytest

            os._exit(int(pytest.main(args)))
        finally:
            os._exit(3)
    signal.signal(signal.SIGALRM, lambda *_: os.kill(pid, signal.SIGKILL))
    signal.alarm(CHILD_TIMEOUT_S)
    _, status = os.waitpid(pid, 0)
    signal.alarm(0)
    code = os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1
    os.close(fd)
    with open(log_path) as f:
        output = f.read()
    os.unlink(log_path)
    if code == 4 and "ERROR collecting" in output:
        return 1  # the mutant broke an import; pytest reports the node ids as not found
    if code in (4, 5):
        with open("mutmut_problems.log", "a") as out:
            out.write(f"== pytest exit {code}: {' '.join(args)}\n{output[-2000:]}\n")
    return 0 if code in (0, 5) else 1


def run(path: str, args: list[str]) -> int:
    """Ask the server to run pytest; 0 (survived) and a line in mutmut_problems.log if it is gone."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
            c.connect(path)
            c.sendall((json.dumps({"args": args}) + "\n").encode())
            return int(c.makefile().readline())
    except (OSError, ValueError) as e:  # never count a mutant as killed because the server died
        with open("mutmut_problems.log", "a") as out:
            out.write(f"== pytest exit none: the server did not answer ({e!r}): {' '.join(args)}\n")
        return 0


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
