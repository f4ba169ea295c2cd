"""`core.runtime.cuda` under the name CUDA candidates stored by earlier versions of Kiln import.

The same module object, not a copy: a candidate importing either name launches through one
pycuda context.
"""

import sys

from core.runtime import cuda

sys.modules[__name__] = cuda
