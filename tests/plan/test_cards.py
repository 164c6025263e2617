"""The cards `--gpu` names: what torch reports for each, from published prints, and the budget it gives."""

from __future__ import annotations

import json

import pytest
import torch

from helpers.meta.target_kernels import GPUS
from helpers.plan import cli
from helpers.plan.calibration import CALIBRATION_DIR
from helpers.plan.cards import CARDS, CONTEXT_BYTES, auto_card, budget_bytes, card, cublas_workspace_bytes


def test_every_card_sold_as_n_gb_reports_less_than_n_gib() -> None:
    """No card reports what it is sold as, read in GiB: an L4 sold as 24 GB reports 21.96 GiB, an H200 sold
    as 141 GB 139.8 GiB; each row names the print its total comes from."""
    for c in CARDS.values():
        sold = float(c.sold_as.split()[0])
        assert 0.85 * sold < c.total_gib < sold, (c.name, c.total_gib, c.sold_as)
        assert c.device_name.removeprefix("NVIDIA ") in c.source, c.name  # the print names the card
    assert round(card("L4").total_gib, 2) == 21.96 and round(card("T4").total_gib, 2) == 14.75


def test_the_h200_row_agrees_with_our_own_run_and_capabilities_with_the_kernel_table() -> None:
    """The published H200 print and our H200 run (docs/calibration) agree on 139.8 GiB; a card named in
    both tables has one compute capability."""
    run = json.loads(next(CALIBRATION_DIR.glob("h200-*.json")).read_text())["run"]
    assert abs(card("H200").total_gib - run["total_memory_gib"]) < 0.05
    for name, cap in GPUS.items():
        if name in CARDS:
            assert CARDS[name].capability == cap, name


def test_cards_are_found_by_name_or_device_name_and_others_are_refused() -> None:
    """`card` reads "l4" and "NVIDIA L4" alike; an unknown name is a ValueError listing the known ones."""
    assert card("l4") is card("NVIDIA L4") is CARDS["L4"]
    assert card("nvidia h100 80gb hbm3") is CARDS["H100"]
    with pytest.raises(ValueError, match="known cards are T4, .*H200"):
        card("A100")  # 40 or 80 GB: ambiguous, so not one card
    assert budget_bytes(CARDS["L4"]) == 23583784960 - CONTEXT_BYTES


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message a machine without a GPU gets")
def test_auto_without_a_gpu_says_so() -> None:
    """`--gpu auto` on a machine without CUDA is an error naming the cards to pick from instead."""
    with pytest.raises(ValueError, match="needs a CUDA GPU.*L4"):
        auto_card()


def test_the_command_plans_for_the_card_unless_a_budget_is_given(capsys: pytest.CaptureFixture[str]) -> None:
    """`--gpu L4` alone plans within what an L4 reports less the context; `--budget` still overrides."""
    args = ["--preset", "gpt2-small", "--seq-len", "32", "--effective-batch", "2", "--checkpoint", "none",
            "--json"]
    assert cli.main([*args, "--gpu", "L4"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["budget_bytes"] == 23583784960 - CONTEXT_BYTES
    assert any(line.startswith("budget 21.59 GiB: the NVIDIA L4 (sold as 24 GB) reports 21.96 GiB")
               for line in out["source"])
    assert cli.main([*args, "--gpu", "L4", "--budget", "8GiB"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["budget_bytes"] == 8 * 2**30 and out["card_total_bytes"] is None  # no card line then
    with pytest.raises(SystemExit):
        cli.main([*args, "--gpu", "bogus"])
    assert "T4, V100-16GB, L4" in capsys.readouterr().err


def test_cublas_workspaces_follow_torchs_sizes_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two workspaces (the forward's thread and autograd's): 32 MiB each on sm90 and later, ':4096:2:16:8'
    (8 MiB + 128 KiB) before; CUBLAS_WORKSPACE_CONFIG's SIZE KiB x COUNT pairs when set, ':0:0' none."""
    assert cublas_workspace_bytes(90, "") == cublas_workspace_bytes(120, "") == 2 * 32 * 2**20
    assert cublas_workspace_bytes(89, "") == cublas_workspace_bytes(75, "") == 2 * (8 * 2**20 + 128 * 1024)
    assert cublas_workspace_bytes(80, ":4096:8") == 2 * 32 * 2**20
    assert cublas_workspace_bytes(90, ":16:8") == 2 * 128 * 1024
    assert cublas_workspace_bytes(90, ":0:0") == 0
    assert cublas_workspace_bytes(80, "junk") == cublas_workspace_bytes(80, "")  # torch warns: the default
    assert cublas_workspace_bytes(90, "", handles=1) == 32 * 2**20
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":1024:3")
    assert cublas_workspace_bytes(90) == 2 * 3 * 2**20
    with pytest.raises(ValueError, match="^capability"):
        cublas_workspace_bytes(200)


def test_a_card_plan_shows_the_workspaces_and_the_card_as_nvidia_smi_would(
        capsys: pytest.CaptureFixture[str]) -> None:
    """`--gpu H200` plans the workspaces beside the tensors (allocated = tensors + 64 MiB) and prints what
    nvidia-smi would show: allocated + the CUDA context, of the card's total."""
    args = ["--preset", "gpt2-small", "--seq-len", "32", "--effective-batch", "2", "--checkpoint", "none",
            "--gpu", "H200"]
    assert cli.main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    plan = out["plan"]
    assert out["cuda_workspace_bytes"] == 2 * 32 * 2**20
    assert plan["predicted_allocated_bytes"] == plan["predicted_peak_bytes"] + 2 * 32 * 2**20
    assert (out["card_total_bytes"], out["cuda_context_bytes"]) == (CARDS["H200"].total_bytes, CONTEXT_BYTES)
    assert cli.main(args) == 0  # the same plan (kept by the CLI), as a table
    text = capsys.readouterr().out
    used = (plan["predicted_allocated_bytes"] + CONTEXT_BYTES) / 2**30
    assert "+ cuBLAS workspaces 64.0 MiB" in text
    assert f"what nvidia-smi would show at the peak: {used:.1f} GiB" in text
    assert "of the card's 139.8 GiB" in text
