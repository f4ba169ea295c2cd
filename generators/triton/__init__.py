"""Tier-1 kernels: Triton, written from the site's graph."""
