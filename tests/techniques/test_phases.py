"""helpers.techniques.phases (lesson 06): an update measured phase by phase, and the lesson's measurer."""

from __future__ import annotations

import pytest
import torch
from support.updates import mlp_adam, mlp_update

from helpers.core.data import token_batch
from helpers.core.training import lm_loss
from helpers.models.gpt import GPT, GPTConfig, seeded_gpt
from helpers.techniques import phases
from helpers.techniques.accumulation import compare_grads, flat_grad, full_batch_grad

CPU = torch.device("cpu")
SMALL_GPT = GPTConfig(vocab_size=1024, seq_len=16, d_model=32, n_heads=2, n_layers=2, dropout=0.0)
TINY = GPTConfig(vocab_size=5, seq_len=3, d_model=4, n_heads=2, n_layers=2, dropout=0.0)


def _mlp_phases(b: int) -> phases.PhaseMemory:
    model, opt = mlp_adam()
    return phases.measure_phases(mlp_update(model, opt, b), model=model, optimizer=opt)


def test_phase_memory_reads_like_step_memory() -> None:
    m = _mlp_phases(2)
    assert m.peak_bytes == max(m.forward_peak_bytes, m.optimizer_peak_bytes)
    assert sum(m.breakdown.values()) == m.peak_bytes
    assert m.floor_bytes > 0 and m.binding_phase in ("forward", "optimizer")
    assert m.method == "cpu-tracker" and m.optimizer_peak_bytes > 0


def test_measure_phases_validates() -> None:
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError, match="update"):
        phases.measure_phases(42, model=model, optimizer=opt)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="optimizer"):
        phases.measure_phases(lambda: None, model=model, optimizer="adam")  # type: ignore[arg-type]


def test_update_measurer_validates() -> None:
    model = GPT(SMALL_GPT).train()
    with pytest.raises(TypeError, match="GPT"):
        phases.UpdateMeasurer(torch.nn.Linear(2, 2))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="checkpointed"):
        phases.UpdateMeasurer(model, checkpointed=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="optimizer='lion'"):
        phases.UpdateMeasurer(model, optimizer="lion")
    with pytest.raises(ValueError, match="micro_batch"):
        phases.UpdateMeasurer(model)(0)


def test_checkpointing_lowers_the_measured_forward_peak() -> None:
    model = GPT(SMALL_GPT).train()
    plain = phases.UpdateMeasurer(model)
    ckpt = phases.UpdateMeasurer(model, checkpointed=True, optimizer=plain.optimizer)
    a, b = plain(8), ckpt(8)
    assert b.forward_breakdown["activations"] < a.forward_breakdown["activations"]
    assert model.block_wrapper is None, "the measurer puts the model's block wrapper back"


def test_accumulate_update_steps_on_the_full_batch_gradient() -> None:
    # K = 4 micro-batches of 2 sequences: the gradient at the optimizer step must be the gradient
    # of the mean loss over all 8 sequences, taken in one forward and backward (dropout off).
    model = seeded_gpt(GPTConfig(vocab_size=32, seq_len=16, d_model=16, n_heads=2, n_layers=2,
                                 dropout=0.0), CPU)
    batches = [token_batch(2, 16, 32, seed=i) for i in range(4)]
    inputs = torch.cat([idx for idx, _ in batches])
    targets = torch.cat([t for _, t in batches])
    expected = full_batch_grad(model, lm_loss, inputs, targets)  # before the update moves weights
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    captured: list[torch.Tensor] = []
    opt.register_step_pre_hook(lambda *_: captured.append(flat_grad(model)))
    phases.accumulate_update(model, opt, batches)
    assert len(captured) == 1
    assert compare_grads(expected, captured[0]).max_rel <= 1e-5


# -- Killing tests for the mutation run (issue 16): expected values counted by hand --------------------

P16 = 16 * 16 * 4  # bytes of a 16x16 float32 weight (and of its gradient, and of one state tensor like it)
# A Python number passed to a tensor op (`buf.mul_(momentum)`) is wrapped into an 8-byte tensor before
# the op, and the kernel converts it (8 + 4 bytes more): the CPU allocator holds them, the tracker cannot
# see them. An optimizer step has at most one such number in flight: at most 20 bytes (torch 2.13).
_WRAPPED_NUMBERS = 24


def _linear16() -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(16, 16, bias=False)


def _state_bytes(opt: torch.optim.Optimizer) -> int:
    """Bytes of the optimizer's own state tensors, read from torch's optimizer after a step."""
    return sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values()
               if isinstance(t, torch.Tensor))


def _measure_linear16(opt_factory, batch: int) -> tuple[phases.PhaseMemory, int]:
    model = _linear16()
    opt = opt_factory(model.parameters())
    x = torch.randn(batch, 16)

    def update() -> None:
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()  # one expression: no loss tensor outlives backward
        opt.step()

    update()  # warm-up: the optimizer state exists
    return phases.measure_phases(update, model=model, optimizer=opt), _state_bytes(opt)


def test_sgd_momentum_step_peak_is_weights_grads_and_buffers() -> None:
    """SGD with momentum steps in place: its phase holds exactly weight + gradient + momentum buffer.

    The forward phase, with a 64-row batch, holds at least the weight, the buffer and the
    64x16 float32 output kept for backward, so it binds.
    """
    m, state = _measure_linear16(lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), batch=64)
    assert state == P16  # one momentum buffer the size of the weight
    numbers = m.optimizer_breakdown["other"]  # the allocator's only: see _WRAPPED_NUMBERS
    assert m.optimizer_breakdown == {"parameters": P16, "gradients": P16, "optimizer_state": P16,
                                     "activations": 0, "other": numbers}
    assert 0 < numbers <= _WRAPPED_NUMBERS
    assert m.optimizer_peak_bytes == 3 * P16 + numbers
    assert m.forward_breakdown["parameters"] == P16 and m.forward_breakdown["optimizer_state"] == P16
    assert m.forward_breakdown["activations"] >= 64 * 16 * 4
    assert m.forward_peak_bytes > m.optimizer_peak_bytes
    assert m.binding_phase == "forward" and m.peak_bytes == m.forward_peak_bytes
    assert m.breakdown == m.forward_breakdown and m.floor_bytes == 2 * P16  # weight + buffer at the peak
    assert m.device == "cpu" and m.method == "cpu-tracker"


def test_adam_step_binds_at_one_row() -> None:
    """Single-tensor Adam (CPU's default) at a batch of one row: the step sets the peak.

    Step phase: weight + gradient + Adam's state (exp_avg, exp_avg_sq, a 4-byte step count)
    + two weight-sized temporaries alive together (`exp_avg_sq.sqrt()` and its quotient by
    the bias correction, in torch's `_single_tensor_adam`). The forward phase holds the weight,
    the state and the gradient at the end of backward, plus a few 64-byte row tensors.
    """
    m, state = _measure_linear16(lambda p: torch.optim.Adam(p, lr=0.1, foreach=False), batch=1)
    assert state == 2 * P16 + 4
    numbers = m.optimizer_breakdown["other"] - 2 * P16
    assert m.optimizer_breakdown == {"parameters": P16, "gradients": P16, "optimizer_state": state,
                                     "activations": 0, "other": 2 * P16 + numbers}
    assert 0 < numbers <= _WRAPPED_NUMBERS
    floor = P16 + P16 + state
    assert floor <= m.forward_peak_bytes <= floor + 256 < m.optimizer_peak_bytes
    assert m.binding_phase == "optimizer" and m.peak_bytes == m.optimizer_peak_bytes
    assert m.breakdown == m.optimizer_breakdown


def test_an_update_without_a_step_has_an_empty_optimizer_phase() -> None:
    model = _linear16()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 16)
    m = phases.measure_phases(lambda: model(x).sum().backward(), model=model, optimizer=opt)
    assert m.optimizer_peak_bytes == 0
    assert m.optimizer_breakdown == dict.fromkeys(("parameters", "gradients", "optimizer_state",
                                                   "activations", "other"), 0)
    assert m.binding_phase == "forward" and m.forward_peak_bytes >= 2 * P16  # weight + its gradient


def test_a_tie_goes_to_the_forward_phase_whose_breakdown_is_reported() -> None:
    """Both phases peak at 2 x 1024 bytes: forward as weight + a weight-sized activation,
    the (in-place, stateless) SGD step as weight + a hand-built gradient. The forward phase
    reached the peak first, so it binds, and `breakdown` is its breakdown."""
    model = _linear16()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def update() -> None:
        a = torch.zeros(16, 16)  # a forward-phase tensor the size of the weight
        del a
        model.weight.grad = torch.ones(16, 16)
        opt.step()

    m = phases.measure_phases(update, model=model, optimizer=opt)
    assert m.forward_peak_bytes == m.optimizer_peak_bytes == 2 * P16
    assert m.binding_phase == "forward"
    assert m.breakdown == {"parameters": P16, "gradients": 0, "optimizer_state": 0,
                           "activations": P16, "other": 0}
    assert m.optimizer_breakdown["gradients"] == P16


def test_binding_phase_follows_the_larger_peak_and_results_are_frozen() -> None:
    import dataclasses

    zero = dict.fromkeys(("parameters", "gradients", "optimizer_state", "activations", "other"), 0)
    m = phases.PhaseMemory(10, zero, "cpu", "cpu-tracker", 5, zero, 10, zero)
    assert m.binding_phase == "optimizer"
    assert phases.PhaseMemory(10, zero, "cpu", "cpu-tracker", 10, zero, 10, zero).binding_phase == "forward"
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.peak_bytes = 0  # type: ignore[misc]


def test_accumulate_update_frees_stale_gradients_before_the_first_forward() -> None:
    """`set_to_none=True`: the previous update's gradients are released, not zeroed in place,
    so the first micro-step's forward pass runs without gradient memory."""
    model = seeded_gpt(GPTConfig(vocab_size=32, seq_len=16, d_model=16, n_heads=2, n_layers=2,
                                 dropout=0.0), CPU)
    for p in model.parameters():
        p.grad = torch.ones_like(p)  # stale gradients of an earlier update
    seen: list[bool] = []
    model.register_forward_pre_hook(lambda *_: seen.append(all(p.grad is None for p in model.parameters())))
    phases.accumulate_update(model, torch.optim.SGD(model.parameters(), lr=0.1),
                             [token_batch(2, 16, 32, seed=i) for i in range(2)])
    assert seen == [True, False]  # the second micro-step runs with the first one's gradients


def _tiny_gpt():
    return seeded_gpt(GPTConfig(vocab_size=32, seq_len=16, d_model=16, n_heads=2, n_layers=2,
                                dropout=0.0), CPU)


def _record(model, opt) -> tuple[list[torch.Tensor], list[int]]:
    inputs: list[torch.Tensor] = []
    steps: list[int] = []
    model.register_forward_pre_hook(lambda _m, args: inputs.append(args[0].clone()))
    opt.register_step_post_hook(lambda *_: steps.append(1))
    return inputs, steps


def test_update_measurer_defaults_warm_up_once_then_two_seeded_micro_steps() -> None:
    """Known sequence: the first call warms up with one 1-sequence micro-step (seed 0), then
    measures 2 micro-steps (the default) of `token_batch(b, ..., seed=0)` and `seed=1`; a second
    call measures only. Afterwards the gradients are freed (set to None)."""
    model = _tiny_gpt()
    measurer = phases.UpdateMeasurer(model)
    inputs, steps = _record(model, measurer.optimizer)
    measurer(2)
    expected = [token_batch(1, 16, 32, seed=0)[0], token_batch(2, 16, 32, seed=0)[0],
                token_batch(2, 16, 32, seed=1)[0]]
    assert len(inputs) == 3 and len(steps) == 2
    for got, want in zip(inputs, expected, strict=True):
        assert torch.equal(got, want)
    assert all(p.grad is None for p in model.parameters())
    inputs.clear()
    steps.clear()
    measurer(3)
    assert [tuple(t.shape) for t in inputs] == [(3, 16), (3, 16)] and len(steps) == 1  # no second warm-up


def test_update_measurer_does_not_warm_up_a_shared_optimizer_that_has_state() -> None:
    model = _tiny_gpt()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    phases.accumulate_update(model, opt, [token_batch(1, 16, 32)])  # state exists now
    measurer = phases.UpdateMeasurer(model, optimizer=opt, steps=1)
    inputs, steps = _record(model, opt)
    measurer(2)
    assert [tuple(t.shape) for t in inputs] == [(2, 16)] and len(steps) == 1


def test_update_measurer_restores_the_models_own_block_wrapper() -> None:
    model = _tiny_gpt()
    calls: list[int] = []

    def own(block: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return block(x)

    model.block_wrapper = own
    m = phases.UpdateMeasurer(model, checkpointed=True)(2)
    assert model.block_wrapper is own and not calls  # checkpoint_every_block replaced it while measuring
    assert m.forward_breakdown["parameters"] > 0


def test_update_measurer_names_a_bad_steps() -> None:
    model = _tiny_gpt()
    with pytest.raises(ValueError, match="^steps must be a positive int"):
        phases.UpdateMeasurer(model, steps=0)
    measurer = phases.UpdateMeasurer(model)
    for bad in (0, -1):
        with pytest.raises(ValueError, match="^steps must be a positive int"):
            measurer.update_for(2, bad)


class _HandStep(torch.optim.Optimizer):
    """Plain SGD (in place, no state) that holds 512 one-float tensors while it steps."""

    def __init__(self, params, lr: float) -> None:  # noqa: ANN001
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None) -> None:  # noqa: ANN001
        p0 = self.param_groups[0]["params"][0]
        xs = [torch.ones(1, device=p0.device) for _ in range(512)]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-group["lr"])
        del xs


@pytest.mark.cuda
def test_cuda_phase_peaks_add_the_allocators_rounding_and_leave_out_foreign_tensors(
    cuda_block_bytes: int,
) -> None:
    """measure_phases on CUDA, against hand counts and the allocator's own block size.

    A 128x128 weight (65536 bytes) gets a hand-built gradient (65536 bytes) and a hand-built
    step that holds 512 one-float tensors (4 bytes each to the tracker, one allocator block
    each). So: forward phase = weight + gradient, nothing rounded ("other" 0); step phase =
    weight + gradient + 512 blocks, all in "other". A 4 MiB tensor held outside is left out.
    Without a step, a forward phase holding 256 one-float tensors peaks at weight + 256 blocks.
    """
    device = torch.device("cuda")
    model = torch.nn.Linear(128, 128, bias=False, device=device)
    p_bytes = 128 * 128 * 4
    opt = _HandStep(model.parameters(), lr=0.1)
    held = torch.empty(2**20, device=device)  # 4 MiB the notebook holds elsewhere
    block = cuda_block_bytes

    def update() -> None:
        opt.zero_grad(set_to_none=True)
        model.weight.grad = torch.ones(128, 128, device=device)  # a hand-built gradient
        opt.step()

    update()  # the gradient exists before measuring, as in steady training
    m = phases.measure_phases(update, model=model, optimizer=opt)
    assert m.method == "cuda-allocator" and m.device.startswith("cuda")
    assert m.forward_breakdown == {"parameters": p_bytes, "gradients": p_bytes, "optimizer_state": 0,
                                   "activations": 0, "other": 0}
    assert m.optimizer_breakdown == {"parameters": p_bytes, "gradients": p_bytes, "optimizer_state": 0,
                                     "activations": 0, "other": 512 * block}
    assert m.forward_peak_bytes == 2 * p_bytes and m.optimizer_peak_bytes == 2 * p_bytes + 512 * block
    assert m.binding_phase == "optimizer"
    assert m.inside_kernels_bytes >= 512 * block  # the rounding counts as the kernels' own bytes

    def forward_only() -> None:
        opt.zero_grad(set_to_none=True)
        xs = [torch.ones(1, device=device) for _ in range(256)]
        del xs
        model.weight.grad = torch.ones(128, 128, device=device)

    n = phases.measure_phases(forward_only, model=model, optimizer=opt)
    assert 256 * block > p_bytes  # so the 256 blocks, not the gradient, set the forward peak
    assert n.forward_peak_bytes == p_bytes + 256 * block and n.optimizer_peak_bytes == 0
    assert n.forward_breakdown["other"] == 256 * block - p_bytes and n.binding_phase == "forward"
    del held


# -- Killing tests for the mutation run (new survivors): phase_peaks on hand-built timelines ------------


def _timeline(phase_list: list[str], totals: list[int], inside: list[int]):
    """A Timeline whose activations are `totals` (other 0), with `inside` as its kernels' own bytes."""
    from helpers.measure.timeline import Timeline

    return Timeline(ops=[f"op{i}" for i in range(len(totals))], phases=phase_list,
                    series={"activations": list(totals), "other": [0] * len(totals)}, inside_kernels=inside)


def test_phase_peaks_first_step_ends_where_a_forward_follows_a_backward() -> None:
    """Hand count: ops 0-2 are micro-step 1 (op 1 is a second forward op, not a new micro-step), op 3
    starts micro-step 2. First step peaks at op 2 (3 bytes), forward at op 3 (10), the step at op 5 (7)."""
    t = _timeline(["forward", "forward", "backward", "forward", "backward", "optimizer"],
                  [1, 2, 3, 10, 4, 7], [0, 0, 30, 100, 0, 70])
    out = phases.phase_peaks(t)
    assert out["first step"] == (3, {"activations": 3, "other": 0}, 30)
    assert out["forward"] == (10, {"activations": 10, "other": 0}, 100)
    assert out["optimizer"] == (7, {"activations": 7, "other": 0}, 70)
    assert out["overall"] == out["forward"]
    assert set(out) == {"forward", "optimizer", "first step", "overall"}


def test_phase_peaks_first_step_ends_where_a_forward_follows_a_recompute_at_op_one() -> None:
    """A forward op right after a recompute (here at op 1) starts the second micro-step, so the first
    step is op 0 alone (1 byte); no optimizer op: that phase is (0, zeros, 0)."""
    t = _timeline(["recompute", "forward", "backward"], [1, 5, 3], [1, 2, 3])
    out = phases.phase_peaks(t)
    assert out["first step"] == (1, {"activations": 1, "other": 0}, 1)
    assert out["forward"] == (5, {"activations": 5, "other": 0}, 2)
    assert out["optimizer"] == (0, {"activations": 0, "other": 0}, 0)
    assert out["overall"] == out["forward"]


def test_phase_peaks_overall_is_the_optimizer_phase_when_it_is_larger() -> None:
    """Forward peaks at 4 bytes, the step at 9: "overall" is the step's peak, breakdown and inside bytes."""
    out = phases.phase_peaks(_timeline(["forward", "backward", "optimizer"], [4, 2, 9], [0, 0, 5]))
    assert out["overall"] == (9, {"activations": 9, "other": 0}, 5) == out["optimizer"]


# -- measure_phases: first step and the `del predictions` loop, against a hand count ---------------------


def _mse(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (pred - target).square().mean()


def _accumulated_linear16(k: int) -> phases.PhaseMemory:
    model = _linear16()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randn(64, 16, generator=gen), torch.randn(64, 16, generator=gen)) for _ in range(2)]

    def update() -> None:
        phases.accumulate_update(model, opt, batches[:k], loss_fn=_mse)

    update()
    return phases.measure_phases(update, model=model, optimizer=opt)


def test_first_step_peak_is_the_peak_of_an_update_of_one_micro_step() -> None:
    """K = 2: the first micro-step peaks like a K = 1 update's forward phase (no gradient yet); the whole
    forward phase adds the 16x16 gradient (1024 bytes) the second micro-step runs with."""
    one, two = _accumulated_linear16(1), _accumulated_linear16(2)
    assert isinstance(two.first_step_peak_bytes, int)
    assert two.first_step_peak_bytes == one.forward_peak_bytes
    assert two.first_step_breakdown == one.forward_breakdown and two.first_step_breakdown["gradients"] == 0
    assert two.forward_peak_bytes == two.first_step_peak_bytes + P16
    assert two.forward_breakdown["gradients"] == P16


def test_released_drops_the_last_predictions_from_both_phases() -> None:
    """`del predictions` frees the 64x16 float32 logits (4096 bytes): the loop as written holds them
    at its forward peak and through the step, the released loop does not."""
    m = _accumulated_linear16(2)
    r = m.released
    assert r is not None and r.released is None
    logits = 64 * 16 * 4
    assert m.forward_peak_bytes - r.forward_peak_bytes == logits
    assert m.optimizer_peak_bytes - r.optimizer_peak_bytes == logits
    assert m.forward_breakdown["activations"] - r.forward_breakdown["activations"] == logits
    assert r.first_step_peak_bytes < m.first_step_peak_bytes


def test_an_update_without_release_points_has_no_released_result() -> None:
    """A hand-written loop that never calls `release_point` gets `released` None."""
    m, _ = _measure_linear16(lambda p: torch.optim.SGD(p, lr=0.1), batch=4)
    assert m.released is None


def test_phase_memory_defaults_and_annotations() -> None:
    """The optional fields default to 0 / None, and the annotations resolve (no `&` types)."""
    import typing

    zero = dict.fromkeys(("parameters", "gradients", "optimizer_state", "activations", "other"), 0)
    m = phases.PhaseMemory(10, zero, "cpu", "cpu-tracker", 5, zero, 10, zero)
    assert m.first_step_peak_bytes == 0 and isinstance(m.first_step_peak_bytes, int)
    assert m.first_step_breakdown is None and m.released is None
    assert m.inside_kernels_bytes == 0 and isinstance(m.inside_kernels_bytes, int)
    hints = typing.get_type_hints(phases.PhaseMemory)
    assert hints["first_step_breakdown"] == (dict[str, int] | None)
    assert hints["released"] == (phases.PhaseMemory | None)


def test_measure_phases_refuses_a_meta_model_by_its_own_name() -> None:
    """A model on the meta device is refused, and the message names measure_phases."""
    model = torch.nn.Linear(2, 2, device="meta")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="^measure_phases measures a real step"):
        phases.measure_phases(lambda: None, model=model, optimizer=opt)
