"""What a candidate may name: the static rules' allowlist (`core.evaluate.static_rules`).

A candidate names modules only as the roots of dotted paths, and each path must be one of these:
torch's allocation, view and metadata calls and dtypes, the modules of `torch.nn` that hold
parameters, the library ops of a site's anchor (matmul, conv), Triton's decorators and helpers,
all of `triton.language` that is not a module, `math`, a few names of `typing` for annotations,
and the CUDA launcher (`core.runtime.cuda.load_kernel`, pycuda's `SourceModule`). Anything else,
and in particular any path to os, sys, builtins, inspect, gc, ctypes, importlib or subprocess,
is refused: a blacklist of names cannot hold, since attribute paths (`torch.os.system`,
`typing.sys.modules`) reach anything. Attribute names on values (which the rules cannot type)
are refused when they are dunders, private, module names or escape hatches from kernels to
Python (`.numpy()`, `.tolist()`, `.item()`).
"""

from __future__ import annotations

import functools

TORCH_NAMES = frozenset({
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full",
    "full_like", "reshape", "flatten", "transpose", "permute", "t", "squeeze", "unsqueeze",
    "broadcast_to", "as_strided", "is_tensor", "finfo", "iinfo", "no_grad", "inference_mode",
    "Size", "device", "dtype", "Tensor", "contiguous_format", "channels_last",
    "channels_last_3d", "strided",
    "float64", "float32", "float16", "bfloat16", "float", "half", "double", "int64", "int32",
    "int16", "int8", "uint8", "long", "int", "bool", "complex64", "float8_e4m3fn", "float8_e5m2",
})
TORCH_CUDA_NAMES = frozenset({"get_device_properties", "get_device_capability",
                              "current_device", "device_count", "is_available"})
NN_NAMES = frozenset({
    "Module", "Parameter", "ModuleList", "ParameterList", "ModuleDict", "ParameterDict",
    "Linear", "Bilinear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
    "ConvTranspose3d", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "LayerNorm", "GroupNorm",
    "RMSNorm", "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "Embedding",
})
# Library ops a candidate may call only for its site's anchor (`problem_anchors`).
ANCHOR_CALLS: dict[str, str] = {
    "torch.nn.functional.linear": "matmul", "torch.matmul": "matmul", "torch.mm": "matmul",
    "torch.bmm": "matmul", "torch.addmm": "matmul", "torch.baddbmm": "matmul",
    "torch.nn.functional.conv1d": "conv", "torch.nn.functional.conv2d": "conv",
    "torch.nn.functional.conv3d": "conv", "torch.nn.functional.conv_transpose1d": "conv",
    "torch.nn.functional.conv_transpose2d": "conv", "torch.nn.functional.conv_transpose3d": "conv",
}
TRITON_NAMES = frozenset({"jit", "autotune", "heuristics", "Config", "cdiv", "next_power_of_2"})
TYPING_NAMES = frozenset({"Optional", "Tuple", "List", "Dict", "Union", "Any", "Sequence",
                          "Callable"})
CUDA_LOADER_MODULES = ("core.runtime.cuda", "core.cuda_runtime", "cuda_runtime")
PATHS = frozenset(
    {f"torch.{n}" for n in TORCH_NAMES} | {f"torch.cuda.{n}" for n in TORCH_CUDA_NAMES}
    | {f"torch.nn.{n}" for n in NN_NAMES} | set(ANCHOR_CALLS)
    | {f"triton.{n}" for n in TRITON_NAMES} | {f"typing.{n}" for n in TYPING_NAMES}
    | {f"{m}.{n}" for m in CUDA_LOADER_MODULES for n in ("load_kernel", "Kernel")}
    | {"pycuda.compiler.SourceModule", "pycuda.driver.In", "pycuda.driver.Out",
       "pycuda.driver.InOut"}
)
# Modules a candidate may import (some only for names from them).
MODULES = frozenset({"torch", "torch.nn", "torch.nn.functional", "triton", "triton.language",
                     "math", "typing", "__future__", "pycuda", "pycuda.compiler",
                     "pycuda.driver", *CUDA_LOADER_MODULES})
# Module paths whose every public, non-module name is allowed.
OPEN_MODULES = ("math", "triton.language", "triton.language.math",
                "triton.language.extra.cuda.libdevice", "triton.language.extra.libdevice")

# Attribute names refused on any value: modules a path could reach, ways out of the kernels
# into Python or numpy, interpreter internals, and the insides of Triton's launcher.
MODULE_ATTRIBUTES = frozenset({
    "os", "sys", "builtins", "inspect", "gc", "ctypes", "importlib", "subprocess", "socket",
    "shutil", "pathlib", "io", "signal", "threading", "multiprocessing", "pickle", "marshal",
    "types", "weakref", "functools", "operator", "codecs", "posix", "tempfile", "mmap",
    "resource", "fcntl", "select", "logging", "warnings", "sysconfig", "site", "runpy",
    "atexit", "traceback", "linecache", "platform", "asyncio", "concurrent", "urllib", "http",
    "time", "random", "np", "numpy", "cffi", "ffi", "libc",
})
ESCAPE_ATTRIBUTES = frozenset({
    "numpy", "tolist", "item", "storage", "untyped_storage", "as_subclass", "apply_", "map_",
    "map2_", "record_stream", "wait_stream", "wait_event", "elapsed_time", "f_globals",
    "f_locals", "f_back", "gi_frame", "gi_code", "cr_frame", "tb_frame", "fn", "run",
    "warmup", "add_pre_run_hook", "pre_run_hooks", "cache", "device_caches", "src",
    "kernel_decorators", "used_global_vals",
})
# Builtins a candidate may use; any other free name is refused.
BUILTINS = frozenset({
    "abs", "all", "any", "bool", "dict", "divmod", "enumerate", "float", "frozenset", "int",
    "isinstance", "issubclass", "iter", "len", "list", "map", "max", "min", "next", "pow",
    "print", "range", "repr", "reversed", "round", "set", "slice", "sorted", "str", "sum",
    "super", "tuple", "zip", "filter", "callable", "hash", "id", "staticmethod",
    "classmethod", "property", "True", "False", "None", "NotImplemented", "Ellipsis",
    "Exception", "ValueError", "RuntimeError", "TypeError", "AssertionError",
    "NotImplementedError", "KeyError", "IndexError", "ArithmeticError",
})
# Builtins named in the rejection as dynamic code, reflection or I/O.
BANNED_BUILTINS = frozenset({
    "open", "exec", "eval", "compile", "__import__", "globals", "locals", "vars", "getattr",
    "setattr", "delattr", "input", "breakpoint", "memoryview", "type", "object", "dir", "help",
    "__builtins__", "bytearray", "bytes",
})
# Calls a launch grid's callable may make: it computes the grid from its meta-parameters.
GRID_CALLS = frozenset({"triton.cdiv", "triton.next_power_of_2", "max", "min", "int", "len",
                        "abs", "tuple"})
GRID_METHODS = frozenset({"numel", "size", "stride", "dim", "element_size"})
GRID_ATTRIBUTES = frozenset({"shape", "ndim"})

# Dotted prefixes refused with a reason of their own: each is a way a candidate has fooled a
# timer or a check.
BANNED_PREFIXES: dict[str, str] = {
    "torch.cuda.Stream": "streams", "torch.cuda.stream": "streams",
    "torch.cuda.set_stream": "streams", "torch.cuda.ExternalStream": "streams",
    "torch.cuda.current_stream": "streams", "torch.cuda.default_stream": "streams",
    "torch.cuda.streams": "streams", "torch.Stream": "streams", "torch.cuda.Event": "timers",
    "torch.Event": "timers", "torch.cuda.graph": "CUDA graphs",
    "torch.cuda.CUDAGraph": "CUDA graphs", "torch.cuda.memory": "the caching allocator",
    "torch.cuda.empty_cache": "the caching allocator", "torch.cuda.manual_seed": "RNG seeding",
    "torch.manual_seed": "RNG seeding", "torch.seed": "RNG seeding",
    "torch.random": "RNG seeding", "torch.set_rng_state": "RNG seeding",
    "torch.save": "file I/O", "torch.load": "file I/O", "torch.from_file": "file I/O",
    "torch.hub": "network", "torch.compile": "other compilers", "torch.jit": "other compilers",
    "torch._dynamo": "other compilers", "torch._inductor": "other compilers",
    "torch.utils": "torch internals", "torch._C": "torch internals",
    "torch.library": "torch internals", "torch.ops": "torch internals",
    "torch.backends": "global numeric flags",
    "torch.set_float32_matmul_precision": "global numeric flags",
    "torch.use_deterministic_algorithms": "global numeric flags",
    "torch.set_default_dtype": "global numeric flags",
    "torch.set_default_device": "global numeric flags",
    "torch.multiprocessing": "subprocesses", "torch.distributed": "network",
    "torch.from_numpy": "numpy", "torch.frombuffer": "raw memory",
    "triton.testing": "timers", "triton.runtime": "the Triton runtime",
    "triton.knobs": "the Triton runtime", "triton.compiler": "the Triton runtime",
    "pycuda.autoinit": "a second CUDA context", "pycuda.driver.Stream": "streams",
    "pycuda.driver.Event": "timers", "pycuda.driver.Context": "a second CUDA context",
    "pycuda.driver.Device": "a second CUDA context",
}
CACHING_DECORATORS = frozenset({"functools.cache", "functools.lru_cache",
                                "functools.cached_property"})
KERNEL_DECORATORS = frozenset({"triton.jit", "triton.autotune", "triton.heuristics"})


def banned_category(name: str) -> str | None:
    for prefix, category in BANNED_PREFIXES.items():
        if name == prefix or name.startswith(prefix + "."):
            return category
    return None


@functools.cache
def open_module_names(module: str) -> frozenset[str]:
    """The public names of an open module that are not modules themselves (the module is
    imported to read them: Triton's language changes from version to version)."""
    import importlib
    import types

    try:
        loaded = importlib.import_module(module)
    except ImportError:
        return frozenset()
    return frozenset(name for name in dir(loaded) if not name.startswith("_")
                     and not isinstance(getattr(loaded, name), types.ModuleType))


def allowed_path(name: str) -> bool:
    """Whether a dotted path rooted at a module may be named: an allowed path, or the public
    non-module name of an open module, followed by any public attributes."""
    parts = name.split(".")
    if any(part.startswith("_") or part in MODULE_ATTRIBUTES | ESCAPE_ATTRIBUTES
           for part in parts[1:]):
        return name in PATHS
    for cut in range(len(parts), 0, -1):
        prefix = ".".join(parts[:cut])
        if prefix in PATHS or prefix in MODULES or prefix in OPEN_MODULES:
            return cut == len(parts) or prefix in PATHS or prefix in OPEN_MODULES and (
                parts[cut] in open_module_names(prefix))
    return False
