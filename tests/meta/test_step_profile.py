"""helpers.meta.step_profile (lesson 09): one update's record read from a timeline set by hand, and the
"blocks done" mark made where autograd has passed every block.

The timeline's every byte is chosen here, so each phase's peak is read off the table below. The
mark is placed against the order in which autograd itself accumulates the layers' gradients.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from helpers.measure.timeline import Timeline
from helpers.meta.step_profile import BLOCKS_DONE, _marks_blocks_done, _step_profile

# Two micro-steps and the optimizer step. Totals: 10 30 40 29 15 45 17 29 23.
PHASES = ["start", "forward", "forward", "backward", "backward", "forward", "backward",
          "optimizer", "optimizer"]
SERIES = {
    "parameters": [10] * 9,
    "gradients": [0, 0, 0, 5, 5, 5, 5, 5, 5],
    "optimizer_state": [0, 0, 0, 0, 0, 0, 0, 8, 8],
    "activations": [0, 20, 30, 10, 0, 30, 0, 0, 0],
    "other": [0, 0, 0, 4, 0, 0, 2, 6, 0],
}
FIELDS = dict(micro_batch=2, accumulation_steps=2, device="meta", method="meta", target="cuda",
              precision="fp32")


def _at(i: int) -> dict[str, int]:
    return {name: values[i] for name, values in SERIES.items()}


def test_a_step_profile_reads_each_phases_peak_off_the_timeline() -> None:
    timeline = Timeline([f"op{i}" for i in range(9)], PHASES, SERIES,
                        marks=[(2, "end of forward"), (5, "end of forward")])
    step = _step_profile(timeline, FIELDS)
    assert (step.peak_bytes, step.breakdown) == (45, _at(5))  # the second micro-step's forward
    assert (step.forward_end_bytes, step.forward_end_breakdown) == (45, _at(5))  # the last mark
    assert (step.backward_peak_bytes, step.backward_breakdown) == (29, _at(3))  # ops 3, 4 and 6
    assert (step.optimizer_peak_bytes, step.optimizer_breakdown) == (29, _at(7))
    assert (step.forward_peak_bytes, step.forward_breakdown) == (45, _at(5))  # everything before the step
    assert (step.first_step_peak_bytes, step.first_step_breakdown) == (40, _at(2))  # ops 0 to 4
    assert step.inside_kernels_bytes == 0 and step.timeline is timeline
    assert (step.micro_batch, step.accumulation_steps, step.target) == (2, 2, "cuda")
    assert step.phases == {"end of forward": _at(5), "backward peak": _at(3), "optimizer step peak": _at(7)}


class _Marks:
    """Stands in for the tracker: records each mark in the one list autograd's events go to."""

    def __init__(self, events: list[str]) -> None:
        self.events = events

    def mark(self, label: str, collect: bool = True) -> None:
        self.events.append(label)


class _Net(nn.Module):
    def __init__(self, checkpointed: bool = False) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 4)
        self.blocks = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))
        self.checkpointed = checkpointed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = checkpoint(block, h, use_reentrant=False) if self.checkpointed else block(h)
        return h.sum()


def _events(net: _Net, tracker: _Marks | None, events: list[str]) -> list[str]:
    names = {"embed": net.embed.weight, **{f"block {i}": b.weight for i, b in enumerate(net.blocks)}}
    for name, p in names.items():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(lambda _, name=name: events.append(name))
    with _marks_blocks_done(net, tracker):
        loss = net(torch.randn(2, 4))
    loss.backward()
    return events


@pytest.mark.parametrize("checkpointed", [False, True])
def test_blocks_done_comes_after_every_blocks_backward_and_before_the_rest(checkpointed: bool) -> None:
    events: list[str] = []
    net = _Net(checkpointed)
    _events(net, _Marks(events), events)
    # once, though a checkpoint calls the first block again in backward
    assert events == ["block 2", "block 1", "block 0", BLOCKS_DONE, "embed"]
    assert not net.blocks[0]._forward_pre_hooks  # the hook is gone after the pass


def test_no_mark_without_a_tracker_blocks_or_an_input_that_needs_grad() -> None:
    events: list[str] = []
    net = _Net()
    _events(net, None, events)
    assert BLOCKS_DONE not in events and not net.blocks[0]._forward_pre_hooks
    plain = nn.Sequential(nn.Linear(4, 4))  # no ModuleList of blocks
    with _marks_blocks_done(plain, _Marks(events)):
        plain(torch.randn(2, 4)).sum().backward()
    assert BLOCKS_DONE not in events
    frozen = _Net()
    frozen.embed.requires_grad_(False)  # the first block's input needs no gradient: nothing to hook
    events.clear()
    _events(frozen, _Marks(events), events)
    assert BLOCKS_DONE not in events and events == ["block 2", "block 1", "block 0"]
