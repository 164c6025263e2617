"""Lesson 09's planner: the meta-device profile matches real CPU measurement, and the command works."""

from __future__ import annotations

import functools
import json
import sys

import pytest
import torch
from torch import nn

from helpers import plan, planner
from helpers.meta_profile import BatchSpec, Profiler, blocks_of, checkpointed_blocks, cuda_kernel
from helpers.models import GPT, GPTConfig

# -- models the planner has never seen ---------------------------------------------------------


class _MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(24, 96)
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(96, 192), nn.Tanh(), nn.Linear(192, 96))
                                    for _ in range(3))
        self.out = nn.Linear(96, 7)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for layer in self.layers:
            x = x + layer(x)
        return self.out(x)


class _ConvBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stages = nn.ModuleList(
            nn.Sequential(nn.Conv2d(c_in, 12, 3, padding=1), nn.BatchNorm2d(12), nn.ReLU())
            for c_in in (3, 12, 12))
        self.head = nn.Linear(12, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for stage in self.stages:
            x = stage(x)
        return self.head(x.mean(dim=(2, 3)))


def _encoder(dropout: float = 0.0) -> nn.Module:
    layer = nn.TransformerEncoderLayer(48, 4, 96, dropout=dropout, batch_first=True)
    return nn.Sequential(nn.Linear(10, 48), nn.TransformerEncoder(layer, 2, enable_nested_tensor=False),
                         nn.Flatten(), nn.Linear(48 * 16, 3))


def _gpt(fused: bool) -> nn.Module:
    return GPT(GPTConfig(vocab_size=96, seq_len=24, d_model=48, n_heads=4, n_layers=2,
                         dropout=0.1, fused_attention=fused))


MODELS = {
    "mlp": (_MLP, BatchSpec.classifier((24,), 7), 16),
    "conv-batchnorm": (_ConvBN, BatchSpec.classifier((3, 12, 12), 5), 8),
    "gpt": (functools.partial(_gpt, False), BatchSpec.lm(24, 96), 6),
    "gpt-fused-attention": (functools.partial(_gpt, True), BatchSpec.lm(24, 96), 6),
    "transformer-encoder": (_encoder, BatchSpec.classifier((16, 10), 3), 6),
}


def _pair(name: str, precision: str = "fp32", **meta_kw: object):  # noqa: ANN202
    build, spec, b = MODELS[name]
    return build, spec, b, {dev: Profiler(build, spec, device=dev, precision=precision, **meta_kw)
                            for dev in ("meta", "cpu")}


@pytest.mark.parametrize("checkpoint", ["none", "blocks"])
@pytest.mark.parametrize("name", list(MODELS))
def test_meta_profile_matches_cpu_within_1_percent(name: str, checkpoint: str) -> None:
    _, _, b, prof = _pair(name)
    meta, cpu = (prof[d].step(b, checkpoint=checkpoint) for d in ("meta", "cpu"))
    assert cpu.method == "cpu-tracker" and meta.method.startswith("meta-tracker")
    for attr in ("peak_bytes", "forward_end_bytes", "backward_peak_bytes", "optimizer_peak_bytes"):
        # never below the CPU allocator's record of the real step, and within 1% of it
        assert 0 <= getattr(meta, attr) / getattr(cpu, attr) - 1 < 0.01, (attr, getattr(meta, attr),
                                                                          getattr(cpu, attr))
    for cat, value in cpu.forward_end_breakdown.items():
        assert meta.forward_end_breakdown[cat] == pytest.approx(value, rel=0.01, abs=512), cat


@pytest.mark.parametrize("name", ["mlp", "gpt", "transformer-encoder"])
def test_checkpointing_lowers_the_activations_it_should(name: str) -> None:
    _, _, b, prof = _pair(name)
    plain = prof["meta"].step(b).forward_end_breakdown["activations"]
    ckpt = prof["meta"].step(b, checkpoint="blocks").forward_end_breakdown["activations"]
    assert ckpt < plain


@pytest.mark.parametrize("name", ["gpt", "gpt-fused-attention", "transformer-encoder", "conv-batchnorm"])
def test_bf16_rule_on_meta_matches_real_cpu_autocast(name: str) -> None:
    _, _, b, prof = _pair(name, precision="bf16")
    for ck in ("none", "blocks"):
        meta, cpu = (prof[d].step(b, checkpoint=ck) for d in ("meta", "cpu"))
        assert 0 <= meta.peak_bytes / cpu.peak_bytes - 1 < 0.01, (ck, meta.peak_bytes, cpu.peak_bytes)
        assert meta.forward_end_bytes == pytest.approx(cpu.forward_end_bytes, rel=0.01), ck


def test_without_routing_meta_attention_keeps_the_score_matrix() -> None:
    build, spec, _, _ = _pair("transformer-encoder")
    real = Profiler(build, spec, device="cpu").step(6)
    routed = Profiler(build, spec).step(6)
    unrouted = Profiler(build, spec, route_attention=False).step(6)
    assert routed.kernels == ("flash",)
    assert unrouted.peak_bytes > 1.01 * real.peak_bytes  # the math path saves the S x S probabilities
    assert 0 <= routed.peak_bytes / real.peak_bytes - 1 < 0.01, (routed.peak_bytes, real.peak_bytes)


def test_cpu_target_follows_the_cpu_kernel_choice_with_dropout() -> None:
    build, spec, _, _ = _pair("transformer-encoder")
    with_dropout = Profiler(functools.partial(_encoder, 0.1), spec).step(2)
    assert with_dropout.kernels == ("math",)  # CPU's flash kernel has no dropout


def test_cuda_target_states_its_kernel() -> None:
    assert cuda_kernel(torch.bfloat16, 64, has_mask=False) == 1  # flash
    assert cuda_kernel(torch.float32, 64, has_mask=False) == 2  # memory-efficient
    assert cuda_kernel(torch.bfloat16, 64, has_mask=True) == 2
    build = functools.partial(GPT, GPTConfig(96, 24, 64, 4, 2, dropout=0.1, fused_attention=True))
    spec = BatchSpec.lm(24, 96)
    fp32 = Profiler(build, spec, target="cuda").step(2)
    bf16 = Profiler(build, spec, target="cuda", precision="bf16").step(2)
    assert fp32.kernels == ("memory-efficient",) and bf16.kernels == ("flash",)
    odd = Profiler(_pair("gpt-fused-attention")[0], spec, target="cuda", precision="bf16").step(2)
    assert odd.kernels == ("math",)  # head_dim 12: no fused CUDA kernel in half precision


def test_user_wrapper_and_generic_blocks() -> None:
    calls: list[int] = []

    def wrapper(block, x):  # noqa: ANN001, ANN202
        calls.append(1)
        return torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)

    build, spec, b, _ = _pair("mlp")
    p = Profiler(build, spec)
    custom = p.step(b, checkpoint=wrapper)
    blocks = p.step(b, checkpoint="blocks")
    assert calls and custom.peak_bytes == blocks.peak_bytes
    model = _MLP()
    assert blocks_of(model) is model.layers
    with checkpointed_blocks(model, "blocks"):
        assert "forward" in vars(model.layers[0])
    assert "forward" not in vars(model.layers[0])
    with pytest.raises(ValueError, match="no nn.ModuleList"):
        blocks_of(nn.Linear(2, 2))


def test_block_extrapolation_equals_the_full_profile() -> None:
    build, spec, _ = plan.preset_spec("gpt2-small", 64)
    full = Profiler(build, spec, target="cuda")
    for ck in ("none", "blocks"):
        fast = plan.preset_profile("gpt2-small", 64, ck)
        slow = full.memory_profile(ck, (1, 2))
        for b in (1, 3, 16):
            assert fast.predict_peak(b) == pytest.approx(slow.predict_peak(b), rel=1e-3)
        assert fast.floor_bytes == slow.floor_bytes


# -- inputs and the command line ----------------------------------------------------------------


@pytest.mark.parametrize(("text", "value"), [("24GB", 24e9), ("24 GiB", 24 * 2**30), ("24e9", 24e9),
                                             ("80gb", 80e9), ("512 MiB", 512 * 2**20), (1e9, 1e9)])
def test_parse_budget(text: object, value: float) -> None:
    assert plan.parse_budget(text) == pytest.approx(value)


def test_a_budget_in_gb_stands_for_a_card_that_reports_gib() -> None:
    """A "24 GB" card reports about 24 GiB: a 10% margin of 24e9 bytes leaves 16% of it free (issue 21)."""
    assert plan.reported_card_bytes(plan.parse_budget("24GB")) == 24 * 2**30
    assert plan.reported_card_bytes(plan.parse_budget("24 GiB")) == 24 * 2**30  # already what it reports
    assert plan.reported_card_bytes(23.5e9) == 23.5e9  # not a whole number of GB: taken as it is
    line = plan.margin_line(24e9, 0.9 * 24e9)
    assert "24.00 GB (22.35 GiB)" in line and "10% of the budget" in line
    free = 1 - 0.9 * 24e9 / (24 * 2**30)
    assert f"{free:.0%} of a card sold as 24 GB" in line and f"{free:.0%}" == "16%"
    assert "--budget 24GiB" in line
    gib = plan.margin_line(24 * 2**30, 0.9 * 24 * 2**30)
    assert "24.00 GiB" in gib and "of a card" not in gib
    assert plan.margin_line(1e9, 1e9).endswith("(no margin)")


@pytest.mark.parametrize("text", ["24 parsecs", "GB", "", "-3GB", "0"])
def test_parse_budget_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="budget"):
        plan.parse_budget(text)
    with pytest.raises(TypeError):
        plan.parse_budget(True)


def test_load_factory_errors() -> None:
    assert plan.load_factory("helpers.plan:example_classifier") is plan.example_classifier
    for bad, msg in [("helpers.plan", "package.module:factory"), ("no_such_pkg.mod:f", "cannot import"),
                     ("helpers.plan:nope", "no attribute"), ("helpers.plan:GB", "not callable")]:
        with pytest.raises(ValueError, match=msg):
            plan.load_factory(bad)


@pytest.mark.parametrize(("argv", "msg"), [
    (["--preset", "gpt5"], "unknown preset"),
    (["--model", "nowhere.at_all:f", "--input-shape", "3", "--num-classes", "2"], "cannot import"),
    (["--preset", "gpt2-small", "--budget", "lots"], "cannot parse budget"),
    (["--model", "helpers.plan:example_classifier"], "describe the batch"),
])
def test_cli_errors_are_clear(argv: list[str], msg: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        plan.main(argv)
    assert exit_.value.code == 2
    assert msg in capsys.readouterr().err


def test_cli_json_for_a_classifier(capsys: pytest.CaptureFixture[str]) -> None:
    assert plan.main(["--model", "helpers.plan:example_classifier", "--input-shape", "3,32,32",
                      "--num-classes", "10", "--budget", "20 MiB", "--effective-batch", "16", "--json",
                      "--target", "cpu"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["plan"]["micro_batch"] * out["plan"]["accumulation_steps"] == 16
    assert out["plan"]["predicted_peak_bytes"] <= 20 * 2**20
    assert set(out["step_at_micro_batch_1"]["plain"]["phases"]) == {"end of forward", "backward peak",
                                                                    "optimizer step peak"}


def test_cli_table_for_a_preset_that_does_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    assert plan.main(["--preset", "gpt2-small", "--seq-len", "128", "--budget", "1GB"]) == 0
    out = capsys.readouterr().out
    assert "NO PLAN" in out and "floor" in out and "weights only" in out
    assert "16% of a card sold as 1 GB" in out  # the margin as a share of what the card reports
    assert "note: mixed precision" in out and "16 B/param" in out  # a note, not a saving
    assert "Kahan" in out and "per-rank peak" in out


def test_report_remedies_save_what_the_hand_count_says() -> None:
    """fp32 Adam is 16 B/param; mixed precision 2 + 2 + 4 + 8 = 16 (no saving), pure bf16 8 (issue 21)."""
    build, spec, cfg = plan.preset_spec("gpt2-small", 64)
    report = plan.plan_model(Profiler(build, spec, target="cuda"), name="gpt2-small", budget_bytes=24e9,
                             effective_batch=8, check=False)
    n = plan.gpt_param_count(cfg)
    assert not any(name.startswith("mixed precision") for name in report.remedies)
    assert report.remedies[planner.PURE_BF16] == pytest.approx(8 * n, rel=1e-3)
    assert any(note.startswith(planner.MIXED_PRECISION) and "16 B/param" in note for note in report.notes)


def test_plan_model_chooses_checkpointing_when_needed() -> None:
    build, spec, _ = plan.preset_spec("gpt2-small", 1024)
    prof = Profiler(build, spec, target="cuda")
    plain, ckpt = (prof.memory_profile(ck, (1, 2)) for ck in ("none", "blocks"))
    low, high = ckpt.predict_peak(1, accumulation_steps=8), plain.predict_peak(1, accumulation_steps=8)
    assert low < high
    budget = (low + high) / 2 / 0.9  # plain micro-batch 1 misses, checkpointed fits
    report = plan.plan_model(prof, name="gpt2-small", budget_bytes=budget, effective_batch=8)
    assert report.plan is not None and report.plan.checkpoint
    assert report.checked_peak_bytes == pytest.approx(report.plan.predicted_peak_bytes, rel=0.01)
    assert report.usable_bytes == pytest.approx(0.9 * budget)


def test_hf_config(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: ANN001
    pytest.importorskip("transformers")
    config = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 128,
              "n_positions": 64}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert plan.main(["--hf-config", str(path), "--seq-len", "32", "--json", "--budget", "1GB"]) == 0
    assert json.loads(capsys.readouterr().out)["parameters"] > 0


def test_hf_config_without_transformers(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # noqa: ANN001
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ValueError, match="needs Hugging Face transformers"):
        plan.hf_factory(str(tmp_path / "config.json"))


# -- the lesson's protocol and exercises --------------------------------------------------------


def test_predicted_peak_matches_the_real_check_run() -> None:
    cfg = plan.check_config("tiny")
    real = Profiler(functools.partial(GPT, cfg), BatchSpec.lm(cfg.seq_len, cfg.vocab_size), device="cpu")
    assert plan.predicted_peak_bytes("tiny") == pytest.approx(real.step(plan.CHECK_MICRO_BATCH).peak_bytes,
                                                              rel=0.01)


def test_show_plan_prints_the_effective_batch(capsys: pytest.CaptureFixture[str]) -> None:
    plan.show_plan("gpt2-small", 256, 2, 4, True, 24.0)
    out = capsys.readouterr().out
    assert "effective batch B x K = 2 x 4 = 8" in out


def test_exercise_checkers() -> None:
    floor = plan.preset_profile("llama-7b", 4096, "none").floor_bytes / 1e9
    assert plan.check_exercise_1(floor).startswith("Correct")
    assert plan.check_exercise_1(10.0).startswith("Not yet")
    assert "number" in plan.check_exercise_1("lots")
    plain, ckpt = plan.preset_profile("gpt2-xl", 1024, "none"), plan.preset_profile("gpt2-xl", 1024, "blocks")
    p = plan.recommend(36e9, 32, plain, ckpt)
    assert plan.check_exercise_2(p.micro_batch, p.accumulation_steps, p.checkpoint).startswith("Correct")
    assert plan.check_exercise_2(32, 1, False).startswith(("Not yet", "Close"))
    saved = plain.activation_bytes_per_example - ckpt.activation_bytes_per_example
    assert plan.check_exercise_3(saved).startswith("Correct")
    assert plan.check_exercise_3(1.0).startswith("Not yet")
    assert "number" in plan.check_exercise_3(None)
