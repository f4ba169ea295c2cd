"""Search: a tree of candidate kernels per site, grown by UCT with progressive widening."""
