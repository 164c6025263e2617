"""Transformers, Accelerate, Lightning and torch.compile, run for real against the lessons' loops.

Imports: core, models, measure, techniques, distributed.
"""
