"""Instruments for the ckpt-vs-accum lessons: one small module per lesson plus a shared core."""
