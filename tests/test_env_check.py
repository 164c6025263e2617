"""helpers.env_check: one line per requirement, non-zero exit when a required one is missing."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

from helpers import env_check
from helpers.env_check import Check, main, parse_version, run_checks

ROOT = Path(__file__).resolve().parent.parent


def _by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


@pytest.fixture(autouse=True)
def _plain_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("LESSONS_DEVICE", "LESSONS_SCALE", "LESSONS_GPU_MEMORY_GB"):
        monkeypatch.delenv(var, raising=False)


def test_floors_match_pyproject() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {}
    for req in project["dependencies"]:
        name, floor = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([\d.]+)", req.replace(" ", "")).groups()
        declared[name.lower()] = parse_version(floor)
    assert declared == env_check.REQUIRED
    assert project["requires-python"] == ">=" + ".".join(map(str, env_check.PYTHON_FLOOR))
    assert "jupyterlab" in env_check.OPTIONAL


def test_this_environment_is_ready(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert lines[-1].startswith("READY")
    assert all(re.match(r"\[( ok |FAIL|warn|info)\] ", line) for line in lines[:-1]), out
    for name in ("Python", "torch", "ipywidgets", "matplotlib", "tqdm", "jupyterlab", "Colab", "CUDA",
                 "scale", "memory method"):
        assert re.search(rf"^\[.{{4}}\] {name}: ", out, re.M), f"no line for {name}:\n{out}"
    checks = _by_name(run_checks())
    # the distribution's version: PyPI's CUDA wheels say 2.5.1 where torch.__version__ says 2.5.1+cu124
    assert checks["torch"].detail.startswith(env_check.installed_version("torch"))
    assert torch.__version__.startswith(env_check.installed_version("torch"))
    expected = "cuda-allocator" if torch.cuda.is_available() else "cpu-tracker"
    assert checks["memory method"].detail == expected
    if not torch.cuda.is_available():
        assert checks["CUDA"].status == "info" and "no CUDA GPU" in checks["CUDA"].detail
        assert checks["scale"].detail == "small (the CPU default)"


def test_missing_required_package_fails(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    real = env_check.installed_version
    monkeypatch.setattr(env_check, "installed_version", lambda d: None if d == "ipywidgets" else real(d))
    assert main([]) == 1
    out = capsys.readouterr().out
    assert "[FAIL] ipywidgets: not installed" in out and "NOT READY: fix ipywidgets" in out


def test_old_torch_fails(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    real = env_check.installed_version
    monkeypatch.setattr(env_check, "installed_version", lambda d: "2.4.1" if d == "torch" else real(d))
    assert main([]) == 1
    assert "[FAIL] torch: 2.4.1 is too old; the lessons need torch >= 2.5" in capsys.readouterr().out


def test_old_python_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(env_check, "PYTHON_FLOOR", (99, 0))
    assert env_check.check_python().status == "FAIL"
    assert main([]) == 1


def test_missing_jupyterlab_only_warns(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    real = env_check.installed_version
    monkeypatch.setattr(env_check, "installed_version", lambda d: None if d == "jupyterlab" else real(d))
    assert main([]) == 0
    assert "[warn] jupyterlab: not installed (optional" in capsys.readouterr().out


def test_bad_lesson_settings_fail(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("LESSONS_SCALE", "huge")
    assert main([]) == 1
    assert "[FAIL] device and scale: LESSONS_SCALE='huge' is not a scale" in capsys.readouterr().out


def test_colab_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab-test")
    assert _by_name(run_checks())["Colab"].detail.startswith("yes")
    monkeypatch.delenv("COLAB_RELEASE_TAG")
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    assert _by_name(run_checks())["Colab"].detail == "no"


def test_parse_version_and_check_validate() -> None:
    assert parse_version("2.13.0+cpu") == (2, 13, 0)
    assert parse_version("7.7.1") == (7, 7, 1) >= (7, 6)
    assert parse_version("2.5.0a0") == (2, 5, 0)
    with pytest.raises(ValueError, match="'dev'"):
        parse_version("dev")
    with pytest.raises(TypeError, match="str"):
        parse_version(2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'great'"):
        Check("great", "x", "y")
    assert main(["--bogus"]) == 2


@pytest.mark.slow  # a fresh interpreter imports torch and every lesson dependency (7 s): make test
def test_module_runs_from_the_command_line() -> None:
    proc = subprocess.run([sys.executable, "-m", "helpers.env_check"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "MPLBACKEND": "Agg"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "READY" in proc.stdout and proc.stderr == ""


def test_a_cuda_report_says_both_units_and_what_the_cap_covers(monkeypatch: pytest.MonkeyPatch) -> None:
    """A "24 GB" card reports 24 GiB; LESSONS_GPU_MEMORY_GB caps the caching allocator only (issue 21)."""
    from types import SimpleNamespace

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda index: SimpleNamespace(total_memory=24 * 2**30, name="Fake GPU"))
    monkeypatch.setenv("LESSONS_GPU_MEMORY_GB", "16")
    checks = _by_name(env_check.check_lessons())
    assert "Fake GPU, 25.8 GB = 24.0 GiB" in checks["CUDA"].detail
    cap = checks["memory cap"].detail
    assert cap.startswith("16 GB (LESSONS_GPU_MEMORY_GB)")
    assert "caching allocator only" in cap and "CUDA context" in cap


def test_a_framework_that_cannot_run_with_this_torch_is_a_warning(monkeypatch: pytest.MonkeyPatch,
                                                                  capsys) -> None:
    from helpers.frameworks import installed

    why = "transformers 9.0 is installed but does not run with torch 2.5.1 (ImportError: too old)"
    monkeypatch.setattr(installed, "versions", lambda: {"transformers": "9.0", "accelerate": None,
                                                          "lightning": "2.6"})
    monkeypatch.setattr(installed, "unusable", lambda name: why if name == "transformers" else None)
    assert main([]) == 0  # optional: the lessons still run
    out = capsys.readouterr().out
    assert f"[warn] transformers: {why}" in out
    assert "[warn] accelerate: not installed (optional" in out and "[ ok ] lightning: 2.6" in out
