"""Kiln's pipeline: load, capture, partition, profile, search, evaluate, integrate."""
