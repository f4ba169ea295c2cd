"""Timing: how Kiln measures, everywhere it measures.

A timer (warm-up, trials, the median), the evaluator's rules on top of it (L2 flushed before
every trial, inputs rotated), and the per-device lock that lets one process time alone.
"""
