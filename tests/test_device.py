"""helpers.device: device choice, scale, seeding, timing."""

from __future__ import annotations

import pytest
import torch

from helpers.device import (
    by_scale,
    lesson_scale,
    median_seconds,
    memory_method,
    pick_device,
    seed_everything,
    setup_lesson,
)


def test_pick_device_default_and_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LESSONS_DEVICE", raising=False)
    assert pick_device().type == ("cuda" if torch.cuda.is_available() else "cpu")
    monkeypatch.setenv("LESSONS_DEVICE", "cpu")
    assert pick_device() == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_requested_without_cuda_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LESSONS_DEVICE", "cuda")
    with pytest.raises(RuntimeError, match="LESSONS_DEVICE=cuda.*cannot see a CUDA GPU"):
        pick_device()


def test_unknown_device_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LESSONS_DEVICE", "tpu")
    with pytest.raises(ValueError, match=r"'tpu'.*\('cpu', 'cuda'\)"):
        pick_device()


def test_scale_default_override_and_bogus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LESSONS_SCALE", raising=False)
    assert lesson_scale(torch.device("cpu")) == "small"
    assert lesson_scale(torch.device("cuda")) == "full"
    monkeypatch.setenv("LESSONS_SCALE", "tiny")
    assert lesson_scale(torch.device("cuda")) == "tiny"
    monkeypatch.setenv("LESSONS_SCALE", "bogus")
    with pytest.raises(ValueError, match=r"'bogus'.*\('tiny', 'small', 'full'\)"):
        lesson_scale(torch.device("cpu"))


def test_by_scale() -> None:
    assert by_scale("small", tiny=1, small=2, full=3) == 2
    with pytest.raises(ValueError, match="huge"):
        by_scale("huge", tiny=1, small=2, full=3)


def test_seed_everything_repeats_and_validates() -> None:
    seed_everything(3)
    a = torch.randn(4)
    seed_everything(3)
    assert torch.equal(a, torch.randn(4))
    for bad in (-1, 1.5, "3"):
        with pytest.raises(ValueError, match="seed"):
            seed_everything(bad)  # type: ignore[arg-type]


def test_setup_lesson_prints_environment(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("LESSONS_DEVICE", "cpu")
    monkeypatch.setenv("LESSONS_SCALE", "tiny")
    monkeypatch.delenv("LESSONS_STRICT", raising=False)
    lesson = setup_lesson(seed=1)
    out = capsys.readouterr().out
    assert lesson.scale == "tiny" and lesson.method == memory_method(lesson.device) == "cpu-tracker"
    assert f"torch {torch.__version__}" in out and "scale tiny" in out and "cpu-tracker" in out


def test_median_seconds() -> None:
    calls = []
    t = median_seconds(lambda: calls.append(1), device=torch.device("cpu"), repeats=3, warmup=2)
    assert len(calls) == 5 and t >= 0
    with pytest.raises(ValueError, match="repeats"):
        median_seconds(lambda: None, device=torch.device("cpu"), repeats=0)
