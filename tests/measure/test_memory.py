"""helpers.memory agrees with independent measurements, on models it has never seen."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from helpers.core.data import token_batch
from helpers.core.device import CPU_TRACKER, TENSOR_TRACKER
from helpers.core.training import lm_loss
from helpers.measure.memory import (
    StepMemory,
    measure_step,
    micro_step_memory,
    new_live_bytes,
    record_timeline,
    run_capped,
    run_or_oom,
    saved_activation_bytes,
    tracked_run,
    tracker_method,
)
from helpers.measure.timeline import CATEGORIES
from helpers.measure.tracker import MemoryTracker
from helpers.models.gpt import GPT, GPTBlock, GPTConfig
from helpers.models.nets import ResidualMLP


class UnseenNet(nn.Module):
    """A model the helpers were not written for: conv, BatchNorm, tanh, attention-like matmul."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(8, 16, 3, padding=1)
        self.bn = nn.BatchNorm1d(16)
        self.mix = nn.Linear(16, 16)
        self.out = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (b, 8, s)
        h = torch.tanh(self.bn(self.conv(x))).transpose(1, 2)  # (b, s, 16)
        att = (h @ h.transpose(1, 2) / 4).softmax(-1)
        return self.out(self.mix(att @ h).sigmoid()).mean(1)


def independent_saved_bytes(forward, params: list[torch.Tensor]) -> int:
    """Distinct storages packed by autograd's saved-tensor hooks, parameters excluded."""
    skip = {p.untyped_storage().data_ptr() for p in params}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in skip:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward()
    seen.pop(out.untyped_storage().data_ptr(), None)
    return sum(seen.values())


CASES = {
    "mlp": (lambda: ResidualMLP(32, 64, 3, 8), lambda: torch.randn(16, 32)),
    "gpt_block": (
        lambda: GPTBlock(GPTConfig(d_model=64, n_heads=4, seq_len=32, dropout=0.1)),
        lambda: torch.randn(4, 32, 64),
    ),
    "unseen": (UnseenNet, lambda: torch.randn(8, 8, 20)),
}


@pytest.mark.parametrize("name", CASES)
def test_saved_activation_bytes_matches_saved_tensor_hooks(name: str) -> None:
    build, make_input = CASES[name]
    model = build().train()
    fwd = lambda: model(make_input()).sum() * 1.0  # input made inside, like a real batch
    ours = saved_activation_bytes(fwd)
    ref = independent_saved_bytes(fwd, list(model.parameters()))
    assert ref > 0
    assert abs(ours - ref) <= 0.01 * ref, (ours, ref)


def test_saved_bytes_with_dropout_counts_masks() -> None:
    cfg = GPTConfig(d_model=64, n_heads=4, seq_len=32, dropout=0.1)
    block = GPTBlock(cfg).train()
    no_drop = GPTBlock(GPTConfig(d_model=64, n_heads=4, seq_len=32, dropout=0.0)).train()
    x = torch.randn(4, 32, 64, requires_grad=True)
    assert saved_activation_bytes(lambda: block(x)) > saved_activation_bytes(lambda: no_drop(x))


def _chain(n: int = 6, width: int = 128) -> nn.ModuleList:
    return nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width))
                         for _ in range(n))


def test_full_checkpointing_keeps_only_the_checkpoint_inputs() -> None:
    blocks = _chain()
    x = torch.randn(64, 128, requires_grad=True)
    inputs: list[torch.Tensor] = []

    def forward() -> torch.Tensor:
        h = x * 1.0  # a fresh tensor, so the first boundary counts too
        for block in blocks:
            inputs.append(h)
            h = checkpoint(block, h, use_reentrant=False)
        return h

    saved = saved_activation_bytes(forward)
    expected = sum(t.untyped_storage().nbytes() for t in inputs)
    assert abs(saved - expected) <= 0.01 * expected, (saved, expected)


def test_selective_checkpointing_lies_between_none_and_full() -> None:
    blocks = _chain()
    x = torch.randn(64, 128, requires_grad=True)

    def policy(ctx, op, *args, **kwargs):  # noqa: ANN001
        save = op in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

    def run(mode: str) -> torch.Tensor:
        h = x * 1.0
        for block in blocks:
            if mode == "none":
                h = block(h)
            elif mode == "full":
                h = checkpoint(block, h, use_reentrant=False)
            else:
                ctx = functools.partial(create_selective_checkpoint_contexts, policy)
                h = checkpoint(block, h, use_reentrant=False, context_fn=ctx)
        return h

    none, sel, full = (saved_activation_bytes(lambda m=m: run(m)) for m in ("none", "selective", "full"))
    assert full < sel < none, (full, sel, none)


def _adam_step(model: nn.Module, make_input):  # noqa: ANN001
    opt = torch.optim.Adam(model.parameters())

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(make_input()).float().pow(2).mean().backward()
        opt.step()

    return opt, step


@pytest.mark.parametrize("name", CASES)
def test_breakdown_sums_to_peak_and_agrees_with_memtracker(name: str) -> None:
    build, make_input = CASES[name]
    model = build()
    opt, step = _adam_step(model, make_input)
    step()  # optimizer state exists from now on
    mem = measure_step(step, model=model, optimizer=opt)
    assert set(mem.breakdown) == set(CATEGORIES)
    assert mem.method == "cpu-tracker" and mem.device == "cpu"

    mt = MemTracker()
    mt.track_external(model, opt)
    with mt:
        step()
    snap = mt.get_tracker_snapshot("peak")[torch.device("cpu")]
    ref = snap["Total"]
    assert abs(mem.peak_bytes - ref) <= 0.05 * ref, (mem.peak_bytes, ref)
    # Per category, against MemTracker and a hand count: state that lives through the whole step.
    by_name = {str(k.value) if hasattr(k, "value") else k: v for k, v in snap.items()}
    params = sum(p.untyped_storage().nbytes() for p in model.parameters())
    assert mem.breakdown["parameters"] == by_name["Parameter"] == params
    n_state = sum(len(st) for st in opt.state.values())  # exp_avg, exp_avg_sq and a step counter each
    assert 2 * params <= mem.breakdown["optimizer_state"] <= 2 * params + 8 * n_state
    b = mem.breakdown
    assert mem.floor_bytes == b["parameters"] + b["gradients"] + b["optimizer_state"] > 3 * params
    buffers = sum(b.untyped_storage().nbytes() for b in model.buffers())
    assert buffers <= mem.breakdown["other"]  # BatchNorm statistics are "other", never activations


def test_step_categories() -> None:
    model = ResidualMLP(32, 64, 3, 8)
    opt, step = _adam_step(model, lambda: torch.randn(16, 32))
    step()
    end = record_timeline(step, model=model, optimizer=opt).at(-1)
    p = sum(q.numel() * 4 for q in model.parameters())
    assert end["parameters"] == end["gradients"] == p
    assert 2 * p <= end["optimizer_state"] <= 2 * p + 4 * 64  # + one step counter per tensor
    assert end["activations"] == 0  # the graph is freed after backward


def test_peak_breakdown_of_a_plain_step_is_its_floor_plus_the_saved_tensors() -> None:
    """measure_step's peak categories against a hand count, on a model with known shapes.

    SGD without momentum keeps no state. The peak comes in backward through the first
    Tanh: its output h (1024 x 512 floats) is still saved, and backward holds two
    temporaries of the same size (the gradient w.r.t. h and w.r.t. the first Linear's
    output). The second Linear's gradients are written by then, the first's not yet.
    """
    model = nn.Sequential(nn.Linear(64, 512), nn.Tanh(), nn.Linear(512, 64), nn.Tanh())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(1024, 64)  # activations (MBs) dwarf the parameters (~260 KB)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(x).sum().backward()
        opt.step()

    mem = measure_step(step, model=model, optimizer=opt)
    h = 1024 * 512 * 4
    b = mem.breakdown
    assert b["parameters"] == sum(q.numel() * 4 for q in model.parameters())
    assert b["optimizer_state"] == 0
    assert b["gradients"] == sum(q.numel() * 4 for q in model[2].parameters())
    assert h <= b["activations"] <= h + 64, b  # h (+ scalars); backward temporaries are not activations
    assert 2 * h <= b["other"] <= 2 * h + 64, b
    assert mem.floor_bytes == b["parameters"] + b["gradients"]
    assert mem.peak_bytes == sum(b.values())


def test_no_grad_forward_keeps_nothing() -> None:
    model = ResidualMLP(32, 64, 3, 8)
    with torch.no_grad():
        assert new_live_bytes(lambda: model(torch.randn(16, 32))) == 0


def test_new_live_bytes_counts_what_fn_keeps_but_not_its_result() -> None:
    kept: list[torch.Tensor] = []

    def fn() -> torch.Tensor:
        kept.append(torch.ones(100))  # 400 bytes that outlive the call
        torch.ones(1000)  # freed at once
        return torch.ones(50)  # the result: excluded

    assert new_live_bytes(fn) == 400 and len(kept) == 1


def test_tracker_marks_follow_live_memory() -> None:
    with MemoryTracker() as tracker:
        a = torch.ones(1000)
        first = tracker.mark("one tensor")
        b = torch.ones(1000)
        second = tracker.mark("two tensors")
        del a, b
        third = tracker.mark("none")
    assert (first, second, third) == (4000, 8000, 0)


def test_bad_inputs_get_clear_errors() -> None:
    model = ResidualMLP(4, 8, 1, 1)
    with pytest.raises(ValueError, match="^step must be a zero-argument callable.*got int"):
        measure_step(3, model=model)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="^model must be a torch.nn.Module"):
        measure_step(lambda: None, model="model")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="requires grad.*got a tensor without grad$"):
        saved_activation_bytes(lambda: model(torch.randn(2, 4)).detach())
    with pytest.raises(ValueError, match="^forward must be a zero-argument callable"):
        saved_activation_bytes(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="^step must be a zero-argument callable.*got str"):
        record_timeline("step", model=model)  # type: ignore[arg-type]
    for helper in (new_live_bytes, run_or_oom):
        with pytest.raises(ValueError, match="^fn must be a zero-argument callable.*got NoneType"):
            helper(None)  # type: ignore[arg-type]
    assert run_or_oom(lambda: 7) == 7


@pytest.mark.cuda
def test_cuda_tracker_agrees_with_the_caching_allocator() -> None:
    device = torch.device("cuda")
    model = ResidualMLP(256, 1024, 4, 256).to(device)
    opt, step = _adam_step(model, lambda: torch.randn(512, 256, device=device))
    step()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    timeline = record_timeline(step, model=model, optimizer=opt)
    torch.cuda.synchronize()
    allocator_peak = torch.cuda.max_memory_allocated() - before + timeline.total[0]
    tracked_peak = max(timeline.total)
    assert abs(tracked_peak - allocator_peak) <= 0.05 * allocator_peak, (tracked_peak, allocator_peak)
    mem = measure_step(step, model=model, optimizer=opt)
    assert mem.method == "cuda-allocator" and sum(mem.breakdown.values()) == mem.peak_bytes
    assert abs(mem.peak_bytes - allocator_peak) <= 0.05 * allocator_peak


@pytest.mark.cuda
def test_cuda_peak_adds_the_allocators_rounding_and_leaves_out_foreign_tensors(cuda_block_bytes: int) -> None:
    """measure_step on CUDA, against the allocator's own count of one small block.

    The step makes 256 one-float tensors (4 bytes each to the tracker); the caching allocator
    gives each a whole block (512 bytes), measured by allocating one (conftest's
    cuda_block_bytes). So the peak is the parameters (64 KiB) + a buffer (16 KiB) + 256 blocks,
    with the blocks' excess over 4 bytes in "other" beside the buffer. A 4 MiB tensor held
    outside the step is not counted.
    """
    device = torch.device("cuda")
    model = nn.Linear(128, 128, bias=False, device=device)  # 65536 bytes
    model.register_buffer("stats", torch.zeros(4096, device=device))  # 16384 bytes: "other"
    held = torch.empty(2**20, device=device)  # 4 MiB the notebook holds elsewhere
    block = cuda_block_bytes

    def step() -> None:
        xs = [torch.ones(1, device=device) for _ in range(256)]
        del xs

    mem = measure_step(step, model=model)
    expected = 65536 + 16384 + 256 * block
    b = mem.breakdown
    assert mem.method == "cuda-allocator" and mem.peak_bytes == sum(b.values())
    assert abs(mem.peak_bytes - expected) <= 4096, (mem.peak_bytes, expected)
    assert b["parameters"] == 65536 and b["activations"] == 256 * 4, b
    assert abs(b["other"] - (16384 + 256 * (block - 4))) <= 4096, b
    assert held.numel() == 2**20


def test_tracker_does_not_outlive_its_region() -> None:
    import gc
    import weakref

    model = ResidualMLP(8, 16, 2, 1)
    opt, step = _adam_step(model, lambda: torch.randn(4, 8))
    tracker = MemoryTracker(model=model, optimizer=opt)
    ref = weakref.ref(tracker)
    with tracker:
        step()
    del tracker
    gc.collect()
    assert ref() is None, "finalizers on the model's storages must not keep the tracker alive"


# -- run_or_oom: a sweep over sizes goes on past a CUDA out-of-memory -------------------------
def _sweep(sizes: list[int], step) -> dict[int, object]:  # noqa: ANN001
    """What a lesson's sweep does: one result per size, None shown as "OOM"."""
    return {n: run_or_oom(lambda n=n: step(n)) for n in sizes}


def test_sweep_survives_an_out_of_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    freed = {"gc": 0, "empty_cache": 0}
    monkeypatch.setattr("helpers.measure.memory.gc.collect",
                        lambda *a: freed.__setitem__("gc", freed["gc"] + 1) or 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache",
                        lambda: freed.__setitem__("empty_cache", freed["empty_cache"] + 1))

    def step(n: int) -> int:
        if n == 8:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 40.00 GiB")
        return int(torch.ones(n).sum())

    results = _sweep([1, 2, 8, 16], step)
    assert results == {1: 1, 2: 2, 8: None, 16: 16}
    assert freed == {"gc": 1, "empty_cache": 1}
    rows = [f"{n}: {'OOM' if r is None else r}" for n, r in results.items()]
    assert rows == ["1: 1", "2: 2", "8: OOM", "16: 16"]


def test_run_or_oom_without_cuda_skips_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: pytest.fail("no CUDA: nothing to empty"))

    def oom() -> None:
        raise torch.cuda.OutOfMemoryError("out of memory")

    assert run_or_oom(oom) is None
    assert run_or_oom(lambda: "fits") == "fits"


def test_run_or_oom_lets_other_errors_through() -> None:
    with pytest.raises(RuntimeError, match="not memory"):
        run_or_oom(lambda: (_ for _ in ()).throw(RuntimeError("not memory")))
    with pytest.raises(ValueError, match="zero-argument callable"):
        run_or_oom(42)  # type: ignore[arg-type]


def gpt_case():
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=64, seq_len=16, d_model=32, n_heads=2, n_layers=2, dropout=0.0)
    x, y = token_batch(12, 16, 64, seed=2)
    return GPT(cfg).eval(), lm_loss, x, y


def _memory_case():
    model, fn, x, y = gpt_case()
    batches = list(zip(x.split(4), y.split(4), strict=True))
    act = saved_activation_bytes(lambda: fn(model(batches[0][0]), batches[0][1]))
    model.zero_grad(set_to_none=True)
    return model, fn, batches, act


def test_micro_step_memory_flat_for_the_correct_loop_and_growing_for_leaks():
    model, fn, batches, act = _memory_case()
    k = len(batches)

    def correct(mark):
        for i, (x, y) in enumerate(batches):
            (fn(model(x), y) / k).backward()
            mark(f"step {i + 1}")

    def retain_and_keep(mark):
        kept = []
        for i, (x, y) in enumerate(batches):
            loss = fn(model(x), y)
            (loss / k).backward(retain_graph=True)
            kept.append(loss)
            mark(f"step {i + 1}")

    def sum_losses(mark):
        total = 0.0
        for i, (x, y) in enumerate(batches):
            total = total + fn(model(x), y) / k
            mark(f"step {i + 1}")
        total.backward()

    flat = micro_step_memory(correct, model)
    assert flat.labels == ["start", "step 1", "step 2", "step 3"]
    assert abs(flat.growth(1, -1)) <= 64  # only the scalar loss is replaced; batches are not counted
    assert flat.method == TENSOR_TRACKER == "tensor-tracker"
    leak = micro_step_memory(retain_and_keep, model)
    steps = [b - a for a, b in zip(leak.live_after[1:], leak.live_after[2:], strict=False)]
    assert min(steps) >= 0.8 * act
    summed = micro_step_memory(sum_losses, model)
    assert summed.growth(0, -1) >= 0.9 * k * act
    assert summed.peak_activations >= 0.7 * k * flat.peak_activations
    assert all(p.grad is None for p in model.parameters())


def test_micro_step_memory_rejects_non_callable():
    with pytest.raises(TypeError, match="callable"):
        micro_step_memory("loop", ResidualMLP(8, 32, 2, 3))


def test_tracker_method_labels():

    assert tracker_method("cpu") == TENSOR_TRACKER != CPU_TRACKER
    assert tracker_method(torch.device("cuda")) == TENSOR_TRACKER == "tensor-tracker"


def test_every_measuring_function_refuses_a_meta_model_and_names_the_planner() -> None:
    """On meta nothing is allocated: a conv + BatchNorm step read 20.7% low there, with no warning.

    Each public function that measures a model's step raises instead, naming the meta profiler and
    the plan command, which count what kernels allocate inside themselves.
    """
    from helpers.measure.memory import micro_step_memory, record_timeline
    from helpers.techniques.phases import measure_phases
    from helpers.techniques.segments import segment_sweep
    from helpers.techniques.tradeoffs import gradient_peak

    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                        nn.Linear(8 * 8 * 8, 10)).to("meta")
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x = torch.randn(4, 3, 8, 8, device="meta")

    def step() -> None:
        net(x).sum().backward()
        opt.step()

    chain = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)).to("meta")
    calls = {
        "measure_step": lambda: measure_step(step, model=net, optimizer=opt),
        "record_timeline": lambda: record_timeline(step, model=net, optimizer=opt),
        "micro_step_memory": lambda: micro_step_memory(lambda mark: step(), net),
        "measure_phases": lambda: measure_phases(step, model=net, optimizer=opt),
        "gradient_peak": lambda: gradient_peak(net, step),
        "segment_sweep": lambda: segment_sweep(chain, torch.randn(2, 4, device="meta"), [1]),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError, match=rf"{name} measures a real step.*meta device.*"
                                             r"meta_profile\.Profiler.*python -m helpers\.plan"):
            call()


def test_a_hand_made_step_memory_has_no_kernel_bytes_unless_given() -> None:
    """A StepMemory built without a kernel figure (a fake measurement) reports 0 bytes inside kernels."""
    breakdown = {"parameters": 400, "gradients": 400, "optimizer_state": 800, "activations": 1000,
                 "other": 96}
    mem = StepMemory(2696, breakdown, "cpu", CPU_TRACKER)
    assert mem.inside_kernels_bytes == 0 and mem.floor_bytes == 1600
    assert StepMemory(2696, breakdown, "cpu", CPU_TRACKER, 64).inside_kernels_bytes == 64


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_tracked_run_keeps_what_could_be_released_unless_asked(device: str) -> None:
    """tracked_run's timeline() holds a 4000-byte output to the end; timeline(released=True) drops it early.

    Hand count: the output (1000 floats) is marked for release, then a 2000-byte temporary comes and
    goes, and the output is kept past the region. On CPU the allocator's timeline, on meta the tracker's.
    """
    kept: list[torch.Tensor] = []
    tracker = MemoryTracker(device=device)

    def run() -> None:
        out = torch.ones(1000, device=device)
        tracker.could_release(out)
        torch.ones(500, device=device)
        kept.append(out)

    timeline_of = tracked_run(run, tracker)
    held, released = timeline_of(), timeline_of(released=True)
    assert max(held.total) == 6000 and max(released.total) == 4000, (held.total, released.total)
    assert held.method == ("cpu-tracker" if device == "cpu" else TENSOR_TRACKER)


def test_micro_step_memory_marks_return_live_bytes_and_growth_spans_the_micro_steps() -> None:
    """mark() returns the live bytes it read; growth() is last mark minus first micro-step (hand count)."""
    model = nn.Linear(2, 2)  # 6 floats: 24 bytes of parameters, live throughout
    returned: list[int] = []

    def loop(mark) -> None:  # noqa: ANN001
        kept = []
        for n in (100, 200, 300):  # keeps 400, then 800, then 1200 more bytes
            kept.append(torch.ones(n))
            returned.append(mark(f"kept {n}"))

    mem = micro_step_memory(loop, model)
    assert mem.live_after == [24, 424, 1224, 2424] and returned == mem.live_after[1:]
    assert mem.growth() == 2424 - 424 == mem.growth(1, -1)
    assert mem.growth(0) == 2400 and mem.peak_bytes == 2424


# -- run_capped on a fake GPU: the cap it sets, the checks before, the cap it puts back -------
class _FakeCuda:
    """GPU 1 of a fake machine: 8 GB, of which the allocator has reserved 1 GB; records every cap set."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from types import SimpleNamespace

        self.caps: list[tuple[float, int]] = []
        props = {1: SimpleNamespace(total_memory=8 * 10**9)}
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props[i])
        monkeypatch.setattr(torch.cuda, "memory_reserved", lambda i: {1: 10**9}[i])
        monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                            lambda f, i: self.caps.append((f, i)))
        monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        monkeypatch.setattr("helpers.measure.memory.gc.collect", lambda *a: 0)  # each full collection: ~0.3 s


def test_run_capped_caps_the_gpu_at_reserved_plus_budget_and_lifts_the_cap_after(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The cap is (reserved + budget - counted) / total, at most 1, on the GPU asked for; then 1.0 again.

    Hand count on an 8 GB GPU with 1 GB reserved: a 3 GB budget caps at 4/8, 2 GB less 0.5 GB counted at
    2.5/8, a 16 GB budget at the whole GPU. An out-of-memory run gives None and lifts the cap too.
    """
    monkeypatch.delenv("LESSONS_GPU_MEMORY_GB", raising=False)
    cuda = _FakeCuda(monkeypatch)
    gpu = torch.device("cuda", 1)
    gb = 10**9
    assert run_capped(lambda: "fits", 3 * gb, gpu) == "fits"
    assert run_capped(lambda: 7, 2 * gb, gpu, counted_bytes=gb // 2) == 7
    assert run_capped(lambda: 8, 16 * gb, gpu, counted_bytes=0) == 8

    def oom() -> None:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    assert run_capped(oom, 3 * gb, gpu) is None
    assert cuda.caps == [(0.5, 1), (1.0, 1), (0.3125, 1), (1.0, 1), (1.0, 1), (1.0, 1), (0.5, 1), (1.0, 1)]


def test_run_capped_puts_back_the_lessons_gpu_memory_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """With LESSONS_GPU_MEMORY_GB=4 on an 8 GB GPU, the process is capped at 4/8 again after the run."""
    monkeypatch.setenv("LESSONS_GPU_MEMORY_GB", "4")
    cuda = _FakeCuda(monkeypatch)
    assert run_capped(lambda: "ran", 2 * 10**9, torch.device("cuda", 1)) == "ran"
    assert cuda.caps == [(3 / 8, 1), (1.0, 1), (0.5, 1)]


def test_run_capped_checks_device_budget_and_counted_bytes_before_touching_the_gpu(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU device or a device name, a budget <= 0 and counted_bytes outside [0, budget) raise ValueError."""
    cuda = _FakeCuda(monkeypatch)
    gpu = torch.device("cuda", 1)
    never = lambda: pytest.fail("fn must not run")  # noqa: E731
    for device in (torch.device("cpu"), "cuda"):
        with pytest.raises(ValueError, match="^run_capped needs a CUDA device"):
            run_capped(never, 10**9, device)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="budget_bytes"):
        run_capped(never, -1.0, gpu)
    for counted in (-1, 10**9, 2 * 10**9):
        with pytest.raises(ValueError, match=r"^counted_bytes must be in \[0, budget_bytes=1000000000\)"):
            run_capped(never, 10**9, gpu, counted_bytes=counted)
    assert cuda.caps == []
