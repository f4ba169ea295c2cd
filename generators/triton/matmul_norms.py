"""Normalizations a matmul tile finishes in registers (`core.runtime.tile_norms`): the tile's
BLOCK_N columns are viewed as BLOCK_N // block segments of `block` columns, each segment's
statistics taken over its own axis, and the normalized tile viewed back, so the product is
stored once, normalized.
"""

from __future__ import annotations

from core.runtime.tile_norms import TileNorm


def finish_lines(index: int, norm: TileNorm, tile: str, weight: str | None,
                 bias: str | None) -> list[str]:
    """Kernel lines setting `v{index}` to `norm` of the tile value `tile`, then its affine."""
    name = f"n{index}"
    segments = f"(BLOCK_M, BLOCK_N // {norm.block}, {norm.block})"
    softmax = norm.name in ("softmax", "log_softmax")
    fill = "float('-inf')" if softmax else "0.0"
    lines = [f"# {norm.name} of each {norm.segment} columns, finished in the tile",
             f"{name}_x = tl.reshape(tl.where(mask, {tile}, {fill}), {segments})",
             f"{name}_in = tl.reshape(mask, {segments})"]
    if softmax:
        # A segment of -inf alone (padding rows, or a row so masked) exponentiates around 0.
        lines += [f"{name}_top = tl.max({name}_x, axis=2)",
                  f"{name}_top = tl.where({name}_top == float('-inf'), 0.0, {name}_top)"
                  "[:, :, None]",
                  f"{name}_e = tl.where({name}_in, tl.exp({name}_x - {name}_top), 0.0)",
                  f"{name}_sum = tl.sum({name}_e, axis=2)[:, :, None]"]
        result = (f"{name}_e / {name}_sum" if norm.name == "softmax"
                  else f"{name}_x - {name}_top - tl.log({name}_sum)")
    elif norm.name == "rms_norm":
        lines.append(f"{name}_ms = tl.sum({name}_x * {name}_x, axis=2)[:, :, None] / "
                     f"{norm.segment}")
        result = f"{name}_x * tl.rsqrt({name}_ms + {norm.eps!r})"
    else:
        lines += [f"{name}_mean = tl.sum({name}_x, axis=2)[:, :, None] / {norm.segment}",
                  f"{name}_d = tl.where({name}_in, {name}_x - {name}_mean, 0.0)",
                  f"{name}_var = tl.sum({name}_d * {name}_d, axis=2)[:, :, None] / "
                  f"{norm.segment}"]
        result = f"{name}_d * tl.rsqrt({name}_var + {norm.eps!r})"
    lines.append(f"v{index} = tl.reshape({result}, (BLOCK_M, BLOCK_N))")
    if weight is not None:
        lines.append(f"v{index} = v{index} * {weight}")
    if bias is not None:
        lines.append(f"v{index} = v{index} + {bias}")
    return lines
