"""Runtime: what an installed model, or an exported kernel package, needs at run time.

Capturing a model's graphs, cutting them into sites, writing and loading site problems, the
guard in front of each kernel, installing kernels in the model, and the CUDA launcher that
tier-2 kernels import. Nothing here imports the rest of Kiln, and its modules import each other
by relative name: the package export copies this folder whole.
"""
