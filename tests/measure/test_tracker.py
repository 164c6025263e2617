"""helpers.measure.tracker: what the tracker counts, by category, against storages counted by hand.

The pure timeline builder (`helpers.measure.timeline`) is tested in `tests/measure/test_timeline.py`,
the dispatch base and the gc freeze nested trackers share (`helpers.measure.dispatch`) in
`tests/measure/test_dispatch.py`.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from helpers.measure.tracker import MemoryTracker


def test_tracker_counts_a_view_once_and_sees_it_freed() -> None:
    with MemoryTracker() as tracker:
        x = torch.empty(256)  # 1 KiB
        views = [x[10:], x.view(16, 16), x[::2]]
        live = tracker.mark("views")
        del x, views
        freed = tracker.mark("freed")
    assert live == 1024 and freed == 0


def test_categories_of_a_hand_built_step() -> None:
    """Every storage of this step is listed by hand: forward keeps a, backward makes grad_a, w.grad.

    loss = (exp(w) * x).sum(), w a parameter of N floats, x made before tracking.
    Forward: a = exp(w) (saved by exp and by mul: an activation), t = a * x (freed once sum has
    read it), loss.
    Backward: the seed 1.0, grad_a = grad_t * x (a backward temporary: "other", never an
    activation), then grad_w = grad_a * a, which becomes w.grad.
    """
    n = 4096
    model = nn.Linear(n, 1, bias=False)  # only a holder for the parameter w
    w = model.weight
    x = torch.randn(1, n)

    def step() -> None:
        (w.exp() * x).sum().backward()

    with MemoryTracker(model=model) as tracker:
        step()
        after_step = tracker.mark("after backward")
    tl = tracker.timeline()
    back = [i for i, ph in enumerate(tl.phases) if ph == "backward"]
    acts, other = tl.series["activations"], tl.series["other"]
    assert back, "backward ops were seen"
    assert 8 * n <= max(acts) <= 8 * n + 64  # a and t (alive until sum has read it), the loss
    assert max(acts[i] for i in back) <= 4 * n + 64  # backward temporaries are not activations
    assert max(other[i] for i in back) >= 4 * n  # grad_a is a backward temporary
    assert tl.series["parameters"][-1] == 4 * n
    assert tl.series["gradients"][-1] == 4 * n and w.grad is not None
    assert acts[-1] <= 64 and other[-1] <= 64  # a and grad_a are gone; scalars may remain
    assert after_step == 8 * n  # live bytes at the end: w and w.grad, nothing else


def test_checkpoint_recompute_counts_as_activations() -> None:
    """Under checkpoint, backward rebuilds the region: that memory is activations, not "other"."""
    n = 4096
    model = nn.Linear(n, 1, bias=False)
    w = model.weight

    def region(v: torch.Tensor) -> torch.Tensor:
        return v.exp().exp()

    with MemoryTracker(model=model) as tracker:
        out = checkpoint(region, w * 1.0, use_reentrant=False)  # keeps only the input, w * 1.0
        fwd_acts = tracker.mark("forward") - 4 * n  # live bytes less the parameter
        out.sum().backward()
        del out
    tl = tracker.timeline()
    back = [i for i, ph in enumerate(tl.phases) if ph in ("backward", "recompute")]
    assert "recompute" in tl.phases
    assert fwd_acts <= 2 * 4 * n + 64  # the input and the output, not the inner exp
    assert max(tl.series["activations"][i] for i in back) >= fwd_acts + 4 * n  # the rebuilt inner exp


def test_parameters_sharing_one_storage_are_counted_once() -> None:
    """Tied weights, and two parameters viewing one storage at different offsets."""
    tied = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=False))
    tied[1].weight = tied[0].weight
    flat = torch.zeros(100)  # 400 bytes
    shared = nn.Module()
    shared.a = nn.Parameter(torch.empty(0))
    shared.b = nn.Parameter(torch.empty(0))
    shared.a.data = flat[:60].view(6, 10)
    shared.b.data = flat[40:]  # starts 160 bytes in
    for model, expected in ((tied, 160), (shared, 400)):
        with MemoryTracker(model=model) as tracker:
            live = tracker.mark("start")
        assert live == expected and tracker.timeline().series["parameters"][-1] == expected
    with MemoryTracker() as tracker:
        base = torch.empty(64)
        view = base[16:]  # a view at an offset: its data_ptr differs, its storage does not
        grown = view.mul_(2.0)  # an in-place op on the offset view returns the same storage again
        live = tracker.mark("views")
        del base, view, grown
    assert live == 256


def test_a_prepared_batch_and_its_views_are_not_counted() -> None:
    """Storages made before the region (a batch) are never counted, however often they are seen."""
    batch = torch.randn(64, 32)  # 8 KiB, made before tracking
    with MemoryTracker() as tracker:
        views = [batch[1:], batch.view(32, 64), batch.t(), batch[::2]]  # views at offsets, twice
        batch.mul_(1.0)  # an in-place op returns the batch's own storage
        again = batch[3:]
        live = tracker.mark("views of the batch")
        kept = batch * 2.0  # a new storage: counted
        after = tracker.mark("one new tensor")
        del views, again
    assert live == 0 and after == 64 * 32 * 4 and kept.shape == batch.shape
    assert max(tracker.timeline().total) == 64 * 32 * 4


def test_a_storage_resized_in_place_is_counted_at_its_new_size() -> None:
    with MemoryTracker() as tracker:
        t = torch.empty(10)
        small = tracker.mark("10 floats")
        t.resize_(100)
        big = tracker.mark("100 floats")
        del t
        gone = tracker.mark("freed")
    assert (small, big, gone) == (40, 400, 0)


def test_phases_are_labelled_forward_backward_optimizer() -> None:
    model = nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(4, 8)
    with MemoryTracker(model=model, optimizer=opt) as tracker:
        loss = model(x).square().sum()
        n_forward = len(tracker.ops) - 1
        loss.backward()
        n_backward = len(tracker.ops) - 1 - n_forward
        before_step = len(tracker.ops)
        opt.step()
        after_step = len(tracker.ops)
        x * 2.0  # an op after the step: forward again
    tl = tracker.timeline()
    assert tl.ops[0] == "start" and tl.phases[0] == "start"
    assert tl.phases[1:1 + n_forward] == ["forward"] * n_forward
    backward = tl.phases[1 + n_forward:1 + n_forward + n_backward]
    assert backward[0] == "forward"  # the seed gradient, made before autograd's engine starts
    assert set(backward[1:]) == {"backward"} and len(backward) >= 4
    stepped = tl.phases[before_step:after_step]
    assert tl.phases[after_step:] == ["forward"]
    assert stepped.count("optimizer") >= len(stepped) // 2 > 0, stepped  # an op or two outside the hooks
    assert tl.method == "tensor-tracker" and tl.marks == []
    # momentum buffers are born in the optimizer step and claimed as optimizer state
    assert tl.series["optimizer_state"][-1] == sum(p.numel() * 4 for p in model.parameters())


def test_a_model_without_parameters_is_tracked_on_the_cpu() -> None:
    with MemoryTracker(model=nn.ReLU()) as tracker:
        y = torch.ones(10)
        live = tracker.mark("one tensor")
    assert tracker.device_type == "cpu" and live == 40 and y.sum() == 10


def test_gradients_freed_inside_the_region_stay_gradients() -> None:
    """Two micro-steps with zero_grad(set_to_none=True) between: the first step's .grad dies
    inside the region, so only the post-accumulate-grad hook can have claimed it."""
    model = nn.Linear(64, 64)
    p = sum(q.numel() * 4 for q in model.parameters())
    x = torch.randn(8, 64)
    with MemoryTracker(model=model) as tracker:
        model(x).sum().backward()
        model.zero_grad(set_to_none=True)
        model(x).sum().backward()
        model.zero_grad(set_to_none=True)
        after = len(tracker.ops)
        y = x * 2.0  # an op after everything: forward again
    tl = tracker.timeline()
    assert max(tl.series["gradients"]) == p and tl.series["gradients"][-1] == 0
    assert max(tl.series["other"]) < p  # no dead gradient left uncategorised
    assert tl.phases[after:] == ["forward"] and y.shape == x.shape


def test_an_empty_output_filled_by_an_out_argument_is_counted() -> None:
    """`torch.add(a, b, out=out)` on an empty `out` grows its storage from 0 to 100 floats."""
    with MemoryTracker() as tracker:
        a, b = torch.ones(100), torch.ones(100)
        out = torch.empty(0)
        empty = tracker.mark("a, b and an empty out")
        torch.add(a, b, out=out)
        full = tracker.mark("out filled")
    assert (empty, full) == (800, 1200) and out.sum() == 200


def test_a_storage_keeps_the_first_category_it_was_claimed_for() -> None:
    """A buffer that aliases a parameter (a detached view of it) is one storage, counted once,
    as a parameter: parameters are claimed first, and a later claim does not move it to "other"."""

    class Aliased(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.zeros(256))  # 1 KiB
            self.register_buffer("alias", self.w.detach())

    with MemoryTracker(model=Aliased()) as tracker:
        live = tracker.mark("model only")
    assert live == 1024
    assert tracker.timeline().at(-1) == {
        "parameters": 1024, "gradients": 0, "optimizer_state": 0, "activations": 0, "other": 0
    }


def test_the_tracker_counts_on_the_models_device() -> None:
    """A model on another device (here "meta", standing in for a GPU on a CPU machine): the tracker
    counts that device's storages and ignores the CPU's. Linear(4, 4) has 20 floats: 80 bytes."""
    model = nn.Linear(4, 4, device="meta")
    with MemoryTracker(model=model) as tracker:
        on_cpu = torch.ones(10)  # 40 bytes on another device: not counted
        on_meta = torch.ones(8, device="meta")  # 32 bytes
        live = tracker.mark("one tensor on each device")
    assert tracker.device_type == "meta" and live == 80 + 32
    assert tracker.timeline().series["parameters"][-1] == 80 and on_cpu.numel() == on_meta.numel() + 2


# -- Issue 21: release points, kernel buffers and times ----------------------------------------------


def test_released_timeline_lets_marked_outputs_die_at_their_release_point() -> None:
    """Hand count: y (1 KiB) is marked right after the loss; the loop keeps it to the end."""
    from helpers.measure.tracker import release_point

    w = torch.ones(256, requires_grad=True)
    with MemoryTracker() as tracker:
        y = w * 2                   # 1 KiB, an activation (the "predictions")
        loss = y.sum()
        release_point(y, loss)       # a `del y` here would free it
        z = torch.empty(512)         # 2 KiB made later, while the loop as written still holds y
        del z
    keep, released = tracker.timeline(), tracker.timeline(released=True)
    assert max(keep.total) == 1024 + 4 + 2048
    assert max(released.total) == 4 + 2048
    assert y.shape == (256,)  # y was held to the end: the release is counted, not made


def test_release_waits_for_a_node_that_saved_the_output() -> None:
    """`pow(2)` saves its input: a `del y` frees nothing until that node has run in backward."""
    w = torch.ones(256, requires_grad=True)
    with MemoryTracker() as tracker:
        y = w * 2
        loss = y.pow(2).sum()
        assert tracker.could_release(y, loss) == 1024
        held_before_backward = [r for r in tracker.records if r.nbytes == 1024 and r.role is None]
        assert all(r.release == math.inf for r in held_before_backward)  # autograd still holds it
        loss.backward()
    rec = next(r for r in tracker.records if r.ptr == y.untyped_storage().data_ptr())
    assert rec.born < rec.release < rec.died == math.inf  # released during backward, not before


def test_kernel_buffers_count_for_one_op_and_held_bytes_until_dropped() -> None:
    def buffers(func, args, kwargs, out):  # noqa: ANN001, ANN202
        return (100, 8) if func.overloadpacket.__name__ == "mul" else 0

    with MemoryTracker(kernel_buffers=buffers) as tracker:
        a = torch.empty(64)          # 256 bytes
        b = a * 3                    # 256 bytes, 100 inside the op, 8 held
        tracker.drop_held()
        c = torch.empty(16)          # 64 bytes
        del a, b, c
    tl = tracker.timeline()
    mul = tl.ops.index("mul")
    assert tl.at(mul)["other"] == 108 and tl.inside_kernels[mul] == 100
    assert tl.inside_kernels[mul + 1] == 0 and tl.at(mul + 1)["other"] == 0  # the held 8 were dropped
    assert tracker.windows[mul][0] <= tracker.windows[mul][1]  # each op's time window is kept


def test_watch_counts_a_tensor_made_outside_any_op_on_any_device() -> None:
    with MemoryTracker(device="meta") as tracker:
        state = torch.get_rng_state()  # a CPU tensor made outside any op
        tracker.watch(state, "other")
        counted = tracker.current_bytes
    assert counted == state.numel()
    with pytest.raises(ValueError, match="role must be one of"):
        tracker.watch(state, "weights")


