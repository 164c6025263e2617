"""`make lab` serves the lessons: JupyterLab starts and lists every notebook.

JupyterLab is the `lab` extra (`make setup` installs it). Without it this test skips,
except under CI=true, where it fails.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # starts a JupyterLab server (5 s): make test
def test_jupyterlab_serves_the_notebooks(tmp_path: Path) -> None:
    if importlib.util.find_spec("jupyterlab") is None:
        reason = "JupyterLab is not installed (pip install -e '.[lab]')"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true, so this test must run: {reason}")
        pytest.skip(reason)
    port, token = _free_port(), "lessons-test"
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root", f"--port={port}",
           "--ip=127.0.0.1", f"--IdentityProvider.token={token}", "notebooks/"]
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path), "JUPYTER_CONFIG_DIR": str(tmp_path),
           "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces")}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline, listing = time.monotonic() + 90, None
        while time.monotonic() < deadline and listing is None:
            try:
                with urllib.request.urlopen(f"{base}/api/contents?token={token}", timeout=5) as r:
                    listing = json.load(r)
            except OSError:
                assert proc.poll() is None, "jupyter lab exited early"
                time.sleep(0.5)
        assert listing is not None, "jupyter lab did not answer within 90 s"
        served = {c["name"] for c in listing["content"]}
        expected = {p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
        assert expected and expected <= served
        with urllib.request.urlopen(f"{base}/lab?token={token}", timeout=10) as r:
            assert r.status == 200 and b"JupyterLab" in r.read()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
