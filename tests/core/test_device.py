"""helpers.device: device choice, scale, seeding, timing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from helpers.core.device import (
    GB,
    SCALES,
    apply_memory_cap,
    by_scale,
    gpu_memory_cap_gb,
    lesson_scale,
    memory_method,
    pick_device,
    pick_scale,
    scale_for_gpu_memory,
    seed_everything,
)
from helpers.lessons.setup import setup_lesson


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


CUDA = torch.device("cuda")


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> dict:
    """Pretend to be a CUDA machine whose GPU has `state["gb"]` GB; record memory-fraction calls."""
    state: dict = {"gb": 16.0, "fractions": []}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda index: SimpleNamespace(total_memory=int(state["gb"] * GB), name="Fake GPU"))
    def set_fraction(fraction: float, device: object = None) -> None:
        if isinstance(device, torch.device) and device.index is None:  # as torch 2.11 does
            raise ValueError(f"Expected a torch.device with a specified index or an integer, got:{device}")
        state["fractions"].append(fraction)

    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", set_fraction)
    for var in ("LESSONS_SCALE", "LESSONS_GPU_MEMORY_GB", "LESSONS_DEVICE"):
        monkeypatch.delenv(var, raising=False)
    return state


def test_scale_default_override_and_bogus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LESSONS_SCALE", raising=False)
    monkeypatch.delenv("LESSONS_GPU_MEMORY_GB", raising=False)
    assert lesson_scale(torch.device("cpu")) == "small"
    monkeypatch.setenv("LESSONS_SCALE", "tiny")
    assert lesson_scale(CUDA) == "tiny"
    assert pick_scale(CUDA) == ("tiny", "LESSONS_SCALE=tiny")
    monkeypatch.setenv("LESSONS_SCALE", "bogus")
    with pytest.raises(ValueError, match=r"'bogus'.*\('tiny', 'small', 'medium', 'full'\)"):
        lesson_scale(torch.device("cpu"))


CLASSES = [(8.0, "small"), (11.99, "small"), (12.0, "medium"), (15.6, "medium"), (24.0, "medium"),
           (39.9, "medium"), (40.0, "full"), (42.4, "full"), (80.0, "full"), (143.8, "full")]


@pytest.mark.parametrize(("gb", "scale"), CLASSES)
def test_scale_for_gpu_memory_classes(gb: float, scale: str) -> None:
    assert scale_for_gpu_memory(gb) == scale


@pytest.mark.parametrize("bad", [0, -3.0, float("nan"), float("inf"), True, "16"])
def test_scale_for_gpu_memory_rejects(bad: object) -> None:
    with pytest.raises(ValueError, match="not a memory size"):
        scale_for_gpu_memory(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(("gb", "scale"), [(15.6, "medium"), (24.0, "medium"), (80.0, "full"), (8, "small")])
def test_scale_from_the_gpu_memory(fake_gpu: dict, gb: float, scale: str) -> None:
    fake_gpu["gb"] = gb
    picked, why = pick_scale(CUDA)
    assert picked == scale == lesson_scale(CUDA)
    assert f"GPU memory {gb:.1f} GB" in why
    assert apply_memory_cap(CUDA) is None and fake_gpu["fractions"] == []


CAPS = [("24", "medium"), ("16", "medium"), ("10", "small"), ("40", "full")]


@pytest.mark.parametrize(("cap", "scale"), CAPS, ids=[f"{c}GB" for c, _ in CAPS])
def test_memory_cap_picks_the_scale_and_caps_the_process(
    fake_gpu: dict, monkeypatch: pytest.MonkeyPatch, cap: str, scale: str
) -> None:
    fake_gpu["gb"] = 80.0
    monkeypatch.setenv("LESSONS_GPU_MEMORY_GB", cap)
    picked, why = pick_scale(CUDA)
    assert picked == scale and "LESSONS_GPU_MEMORY_GB" in why
    assert apply_memory_cap(CUDA) == float(cap)
    assert fake_gpu["fractions"] == [pytest.approx(float(cap) / 80.0)]


def test_scale_override_beats_the_cap(fake_gpu: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpu["gb"] = 80.0
    monkeypatch.setenv("LESSONS_GPU_MEMORY_GB", "16")
    monkeypatch.setenv("LESSONS_SCALE", "full")
    assert lesson_scale(CUDA) == "full"


@pytest.mark.parametrize("raw", ["abc", "0", "-8", "nan", "inf"])
def test_bad_memory_cap_is_a_clear_error(fake_gpu: dict, monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("LESSONS_GPU_MEMORY_GB", raw)
    with pytest.raises(ValueError, match=rf"LESSONS_GPU_MEMORY_GB='{raw}' is not a memory size"):
        gpu_memory_cap_gb()
    with pytest.raises(ValueError, match="LESSONS_GPU_MEMORY_GB"):
        lesson_scale(CUDA)


def test_cap_above_the_gpu_is_rejected(fake_gpu: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpu["gb"] = 16.0
    monkeypatch.setenv("LESSONS_GPU_MEMORY_GB", "24")
    with pytest.raises(ValueError, match=r"more than this GPU has \(16.0 GB\)"):
        lesson_scale(CUDA)


def test_cap_is_ignored_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LESSONS_SCALE", raising=False)
    monkeypatch.setenv("LESSONS_GPU_MEMORY_GB", "16")
    scale, why = pick_scale(torch.device("cpu"))
    assert scale == "small" and "CUDA only" in why
    assert apply_memory_cap(torch.device("cpu")) is None


def test_setup_lesson_prints_cap_and_reason(fake_gpu: dict, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    fake_gpu["gb"] = 80.0
    monkeypatch.setenv("LESSONS_GPU_MEMORY_GB", "24")
    monkeypatch.delenv("LESSONS_STRICT", raising=False)
    lesson = setup_lesson(seed=0)
    out = capsys.readouterr().out
    assert lesson.device.type == "cuda" and lesson.scale == "medium" and lesson.memory_cap_gb == 24.0
    assert lesson.method == "cuda-allocator"
    assert "memory cap 24 GB of 80.0 GB (LESSONS_GPU_MEMORY_GB)" in out
    assert "scale medium: LESSONS_GPU_MEMORY_GB 24.0 GB is in the 12 to under 40 GB class" in out
    assert fake_gpu["fractions"] == [pytest.approx(0.3)]


def test_by_scale() -> None:
    assert by_scale("small", tiny=1, small=2, full=3) == 2
    assert by_scale("medium", tiny=1, small=2, full=3) == 2
    assert by_scale("medium", tiny=1, small=2, medium=5, full=3) == 5
    assert [by_scale(s, tiny=s, small=s, medium=s, full=s) for s in SCALES] == list(SCALES)
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
    assert "scale tiny: LESSONS_SCALE=tiny" in out and "memory cap" not in out
