"""A training update profiled on the meta device: the fast paths, the target's kernels and autocast
rule, kernels' own buffers, the step's record and the `Profiler`.

Imports: core, models, measure, techniques.
"""
