"""The two techniques and their pitfalls, measured: saved tensors, segments and checkpointing;
accumulation, its pitfalls, mixed precision and token-weighted losses; one update phase by phase;
what a step costs; further trade-offs.

Imports: core, models, measure.
"""
