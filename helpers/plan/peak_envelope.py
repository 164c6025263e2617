"""A training update's peak as an exact function of the micro-batch and the depth (lesson 09's presets).

A line fitted to a few peaks follows one piece of the peak and falls below the others: which op
peaks changes with the micro-batch B (at small B a late-backward op with large fixed buffers, such
as the embedding's gradient; at large B the start of backward, with every activation alive) and
with the number of blocks. Fitted at B = 1, 2 and 8 and extended to 16, a 1- and 2-block copy of
GPT-2 small planned the checkpointed 12-block model 9.7% below its full profile; at B = 1,024 and
64 tokens, 88% below. `EnvelopeProfile` predicts from the ops themselves instead:

- **Micro-batch.** On the meta device every tensor of the update is sized linearly in B (from
  B = 2 on; at B = 1 a broadcast's reduction is skipped), so the live bytes after each op are a
  straight line in B, and a phase's peak is the highest of those lines. Two profiles with the same
  op sequence (B = 2 and 8) give every line, hence the peak at any B >= 2 exactly; the profile at
  B = 1 gives that size.
- **Depth.** Each micro-step is cut where the op that binds can change with the number of blocks:
  its forward pass; its backward up to the point where every block's backward has run (the
  gradient of the blocks' input, `helpers.meta.step_profile.BLOCKS_DONE`), where every op holds all the
  remaining blocks' activations and gradients in the same proportion at any depth; and the rest of
  its backward (the embedding's), which holds no activations of blocks. The optimizer step is one
  more part. Every block is identical, so each part's peak at a given B is a straight line in the
  number of blocks: copies with 1 and 2 blocks give it for any depth, and the peak is the highest part.

- `PeakEnvelope.of(one, two, depth)`: from a 1- and a 2-block copy's `StepProfile`s (keyed by B),
  `peak(group, b)` for the groups "forward" (the forward/backward phase of an update of K >= 2
  micro-steps), "first" (that of K = 1) and "optimizer".
- `EnvelopeProfile`: lesson 06's `MemoryProfile` (its fitted lines kept as the description:
  bytes per example, the floor) whose phase peaks come from a `PeakEnvelope`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from helpers.core.validate import positive_int
from helpers.measure.memory_profile import MemoryProfile
from helpers.measure.timeline import Timeline
from helpers.meta.step_profile import BLOCKS_DONE, StepProfile

__all__ = ["GROUPS", "EnvelopeProfile", "PeakEnvelope", "envelopes"]

GROUPS = ("forward", "first", "optimizer")
_SPAN = 6  # the two sizes the lines go through are 2 and 2 + _SPAN (= 8)


def _parts(timeline: Timeline) -> list[tuple[str, range]]:
    """The update cut into parts: (group, ops) for each micro-step's three parts, then the optimizer's.

    A micro-step's group is "first" for the first one, "later" for the others ("forward" takes both).
    """
    phases, n = timeline.phases, len(timeline.phases)
    done = sorted(i for i, label in timeline.marks if label == BLOCKS_DONE)
    starts = [0] + [i for i in range(1, n)
                    if phases[i] == "forward" and phases[i - 1] in ("backward", "recompute")]
    step = next((i for i in range(n) if phases[i] == "optimizer"), n)
    parts = []
    for m, start in enumerate(starts):
        end = starts[m + 1] if m + 1 < len(starts) else step
        backward = next((i for i in range(start, end) if phases[i] not in ("start", "forward")), end)
        blocks_done = next((i for i in done if backward <= i <= end), end)
        group = "first" if m == 0 else "later"
        parts += [(group, range(start, backward)), (group, range(backward, blocks_done)),
                  (group, range(blocks_done, end))]
    return [*parts, ("optimizer", range(step, n))]


def _upper_hull(lines: set[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """The lines (slope, intercept) that are highest somewhere, by slope (exact integer arithmetic)."""
    hull: list[tuple[int, int]] = []
    for s, c in sorted(lines):
        if hull and hull[-1][0] == s:
            hull.pop()  # same slope, lower intercept (sorted)
        # the middle line is never above both neighbours: drop it
        while len(hull) >= 2 and ((hull[-1][1] - hull[-2][1]) * (s - hull[-1][0])
                                  <= (c - hull[-1][1]) * (hull[-1][0] - hull[-2][0])):
            hull.pop()
        hull.append((s, c))
    return tuple(hull)


@dataclass(frozen=True)
class _Part:
    """One part of one copy's update: its group, its peak at B = 1, and its ops' lines for B >= 2.

    A line (d, c) is `(c + d * b) / _SPAN` bytes at micro-batch b.
    """

    group: str
    at_one: int
    lines: tuple[tuple[int, int], ...]

    def peak(self, b: int) -> int:
        """The part's peak at micro-batch `b`, times `_SPAN` (an exact integer)."""
        if b == 1:
            return _SPAN * self.at_one
        return max((c + d * b for d, c in self.lines), default=0)


def _copy_parts(steps: Mapping[int, StepProfile]) -> list[_Part]:
    """The parts of one copy from its profiles at B = 1, 2 and 8 (their timelines)."""
    missing = [b for b in (1, 2, 2 + _SPAN) if b not in steps or steps[b].timeline is None]
    if missing:
        raise ValueError(f"an envelope needs the profiles (with timelines) at micro-batches 1, 2 and "
                         f"{2 + _SPAN}; missing {missing}")
    one, two, eight = (steps[b].timeline for b in (1, 2, 2 + _SPAN))
    if two.ops != eight.ops:
        raise ValueError(f"the ops at micro-batches 2 and {2 + _SPAN} differ, so their live bytes are "
                         "not one line per op; this model's peak cannot be extended exactly")
    cuts = [_parts(t) for t in (one, two)]
    if [g for g, _ in cuts[0]] != [g for g, _ in cuts[1]]:
        raise ValueError("the update at micro-batch 1 has other parts than at 2 (micro-steps, marks)")
    t1, t2, t8 = one.total, two.total, eight.total
    out = []
    for (group, ops1), (_, ops) in zip(*cuts, strict=True):
        lines = {(t8[i] - t2[i], _SPAN * t2[i] - 2 * (t8[i] - t2[i])) for i in ops}
        out.append(_Part(group, max((t1[i] for i in ops1), default=0), _upper_hull(lines)))
    return out


@dataclass(frozen=True)
class PeakEnvelope:
    """Exact phase peaks of a model of `depth` blocks, from the parts of its 1- and 2-block copies."""

    one: tuple[_Part, ...]
    two: tuple[_Part, ...]
    depth: int

    @classmethod
    def of(cls, one: Mapping[int, StepProfile], two: Mapping[int, StepProfile], depth: int) -> PeakEnvelope:
        """From the 1-block and the 2-block copy's `StepProfile`s at micro-batches 1, 2 and 8 (K >= 2)."""
        a, b = _copy_parts(one), _copy_parts(two)
        if [p.group for p in a] != [p.group for p in b]:
            raise ValueError("the 1- and 2-block copies' updates have other parts (micro-steps, marks)")
        return cls(tuple(a), tuple(b), positive_int("depth", depth))

    def peak(self, group: str, b: int) -> int:
        """Peak bytes of `group` ("forward", "first" or "optimizer") at micro-batch `b`, rounded up."""
        if group not in GROUPS:
            raise ValueError(f"group={group!r} is not a group; choose one of {GROUPS}")
        b = positive_int("b", b)
        keep = {"forward": ("first", "later"), "first": ("first",), "optimizer": ("optimizer",)}[group]
        best = 0
        for p1, p2 in zip(self.one, self.two, strict=True):
            if p1.group in keep:
                x1, x2 = p1.peak(b), p2.peak(b)
                best = max(best, x1 + (self.depth - 1) * (x2 - x1))
        return -(-best // _SPAN)


@dataclass(frozen=True)
class EnvelopeProfile(MemoryProfile):
    """A `MemoryProfile` whose phase peaks are a `PeakEnvelope`'s (exact at every micro-batch).

    The fitted lines (floor, bytes per example, the optimizer step's line) stay as they were fitted,
    to describe the profile; `forward_peak`, `optimizer_peak` and so `predict_peak` and
    `binding_phase` read the envelope. `released` (the loop with `del predictions`) is one too.
    """

    envelope: PeakEnvelope | None = None

    def forward_peak(self, b: int, *, accumulation_steps: int = 2, keep_output: bool = True) -> int:
        """The forward/backward phase's peak at micro-batch `b`: K >= 2 ("forward") or K = 1 ("first")."""
        k = positive_int("accumulation_steps", accumulation_steps)
        p = self._loop(keep_output)
        env = getattr(p, "envelope", None)
        if env is None:
            return MemoryProfile.forward_peak(p, b, accumulation_steps=k)
        return env.peak("forward" if k >= 2 else "first", b)

    def optimizer_peak(self, b: int, *, keep_output: bool = True) -> int:
        """The optimizer step's peak at micro-batch `b`."""
        p = self._loop(keep_output)
        env = getattr(p, "envelope", None)
        return MemoryProfile.optimizer_peak(p, b) if env is None else env.peak("optimizer", b)


def envelopes(ones: Sequence[Mapping[int, StepProfile]], depth: int) -> tuple[PeakEnvelope, PeakEnvelope]:
    """The envelopes of the loop as written and of the loop with `del predictions` (`released`).

    `ones` is the 1-block and the 2-block copy's `StepProfile`s by micro-batch.
    """
    one, two = ones
    released = [{b: s.released for b, s in steps.items() if s.released is not None} for steps in (one, two)]
    return PeakEnvelope.of(one, two, depth), PeakEnvelope.of(*released, depth)
