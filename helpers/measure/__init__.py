"""The instruments that measure memory: the dispatch base, the tensor tracker and its timeline, the CPU
allocator's record, `measure_step`, the memory formulas, the OOM reader and the fitted profile.

Imports: core, models.
"""
