"""Integer index expressions: how a coordinate of one tensor is found from the loop's counters.

A site's views (reshape, permute, squeeze, expand) turn the coordinates a kernel loops over into
each tensor's own coordinates; a reshape does it through floor division and remainder. The
expressions here are sums of terms, each a coefficient times a symbol (a loop counter) or times
a floor division or remainder of a smaller expression, and they simplify with what is known of
each symbol's range: `(8 * g + c) // 8` is `g` when `0 <= c < 8`. That is what lets the compiler
see which loop counters a value depends on, and write loads with no needless division.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

# An expression: constant + sum of coefficient * atom. An atom is a symbol's name, or a
# ("//", Expr, k) / ("%", Expr, k) node; atoms are hashable and compare by structure.
Atom = str | tuple


@dataclass(frozen=True)
class Expr:
    terms: tuple[tuple[Atom, int], ...] = ()  # sorted by atom, no zero coefficients
    constant: int = 0

    @staticmethod
    def of(value: int | str | Expr) -> Expr:
        if isinstance(value, Expr):
            return value
        if isinstance(value, str):
            return Expr(((value, 1),))
        return Expr((), int(value))

    @staticmethod
    def _make(terms: Mapping[Atom, int], constant: int) -> Expr:
        terms = {a: c for a, c in terms.items() if c}
        for atom, coef in list(terms.items()):
            if not (isinstance(atom, tuple) and atom[0] == "%"):
                continue
            _, inner, k = atom
            # (e // k) * c * k + (e % k) * c is e * c: a reshape undone by its inverse.
            quotient = ("//", inner, k)
            if terms.get(quotient) == coef * k:
                del terms[atom], terms[quotient]
                return Expr._make(terms, constant) + inner.scale(coef)
            # (e // k) % m * c * k + (e % k) * c is (e % (k * m)) * c: two dimensions of a view
            # that lie one after the other in memory, merged.
            for outer, outer_coef in terms.items():
                if (isinstance(outer, tuple) and outer[0] == "%" and outer_coef == coef * k
                        and outer[1] == Expr(((quotient, 1),))):
                    del terms[atom], terms[outer]
                    merged = Expr(((("%", inner, k * outer[2]), coef),))
                    return Expr._make(terms, constant) + merged
        kept = tuple(sorted(terms.items(), key=lambda t: repr(t[0])))
        return Expr(kept, constant)

    def __add__(self, other: int | str | Expr) -> Expr:
        other = Expr.of(other)
        terms = dict(self.terms)
        for atom, coef in other.terms:
            terms[atom] = terms.get(atom, 0) + coef
        return Expr._make(terms, self.constant + other.constant)

    def scale(self, factor: int) -> Expr:
        return Expr._make({a: c * factor for a, c in self.terms}, self.constant * factor)

    @property
    def is_constant(self) -> bool:
        return not self.terms

    def symbols(self) -> set[str]:
        found: set[str] = set()
        for atom, _ in self.terms:
            if isinstance(atom, str):
                found.add(atom)
            else:
                found |= atom[1].symbols()
        return found


@dataclass(frozen=True)
class Ranges:
    """Each symbol's extent: it takes the values 0 .. size - 1."""

    sizes: Mapping[str, int] = field(default_factory=dict)

    def bounds(self, expr: Expr) -> tuple[int, int]:
        """The smallest and largest value `expr` takes."""
        low = high = expr.constant
        for atom, coef in expr.terms:
            a_low, a_high = self.atom_bounds(atom)
            low += min(coef * a_low, coef * a_high)
            high += max(coef * a_low, coef * a_high)
        return low, high

    def atom_bounds(self, atom: Atom) -> tuple[int, int]:
        if isinstance(atom, str):
            return 0, self.sizes[atom] - 1
        kind, inner, k = atom
        low, high = self.bounds(inner)
        if kind == "//":
            return low // k, high // k
        return (low, high) if low >= 0 and high < k else (0, k - 1)


def floordiv(expr: Expr, k: int, ranges: Ranges) -> Expr:
    """`expr // k`, for a positive k: terms whose coefficient k divides come out whole, and the
    rest is dropped when its range lies within [0, k)."""
    if k == 1:
        return expr
    whole: dict[Atom, int] = {}
    rest: dict[Atom, int] = {}
    for atom, coef in expr.terms:
        (whole if coef % k == 0 else rest)[atom] = coef
    constant_whole, constant_rest = divmod(expr.constant, k)
    out = Expr._make({a: c // k for a, c in whole.items()}, constant_whole)
    remainder = Expr._make(rest, constant_rest)
    low, high = ranges.bounds(remainder)
    if low >= 0 and high < k:
        return out
    if remainder.is_constant:
        return out + remainder.constant // k
    # (q * m + r) // k with k a multiple of m: q // (k // m), when 0 <= r < m.
    inner = _split_multiple(remainder, ranges)
    if inner is not None:
        multiple, quotient, small = inner
        if k % multiple == 0:
            low, high = ranges.bounds(small)
            if low >= 0 and high < multiple:
                return out + floordiv(quotient, k // multiple, ranges)
    return out + Expr((((("//", remainder, k)), 1),))


def mod(expr: Expr, k: int, ranges: Ranges) -> Expr:
    """`expr % k`, for a positive k: terms whose coefficient k divides drop out, and what is left
    stands as it is when its range lies within [0, k)."""
    if k == 1:
        return Expr()
    kept = Expr._make({a: c for a, c in expr.terms if c % k}, expr.constant % k)
    low, high = ranges.bounds(kept)
    if low >= 0 and high < k:
        return kept
    inner = _split_multiple(kept, ranges)
    if inner is not None:
        multiple, quotient, small = inner
        if multiple % k == 0:
            return mod(small, k, ranges)
        if k % multiple == 0:
            low, high = ranges.bounds(small)
            if low >= 0 and high < multiple:
                return mod(quotient, k // multiple, ranges).scale(multiple) + small
    return Expr(((("%", kept, k), 1),))


def _split_multiple(expr: Expr, ranges: Ranges) -> tuple[int, Expr, Expr] | None:
    """`expr` as multiple * quotient + small, the multiple the gcd of the larger coefficients,
    when the terms split so; None otherwise."""
    coefs = sorted({abs(c) for _, c in expr.terms}, reverse=True)
    for multiple in coefs:
        if multiple <= 1:
            continue
        big = {a: c for a, c in expr.terms if c % multiple == 0}
        small = Expr._make({a: c for a, c in expr.terms if c % multiple}, expr.constant % multiple)
        if not big:
            continue
        quotient = Expr._make({a: c // multiple for a, c in big.items()},
                              expr.constant // multiple)
        return multiple, quotient, small
    return None


def linearize(coords: list[Expr], shape: tuple[int, ...]) -> Expr:
    """The row-major flat index of `coords` in `shape`."""
    flat = Expr()
    for coord, size in zip(coords, shape, strict=True):
        flat = flat.scale(size) + coord
    return flat


def unravel(flat: Expr, shape: tuple[int, ...], ranges: Ranges) -> list[Expr]:
    """The coordinates in `shape` of row-major flat index `flat`."""
    coords: list[Expr] = []
    inner = math.prod(shape)
    for size in shape:
        inner //= size
        coords.append(mod(floordiv(flat, inner, ranges), size, ranges) if size > 1 else Expr())
    return coords


def reshape(coords: list[Expr], shape: tuple[int, ...], source: tuple[int, ...],
            ranges: Ranges) -> list[Expr]:
    """Coordinates in `source` of the element at `coords` of its reshape to `shape`: the same
    row-major position. Dimensions are matched in groups of equal product, so that a group
    kept as it is needs no division at all; size-1 dimensions of `source` take coordinate 0."""
    out = [Expr() for _ in source]
    i = j = 0
    while True:
        while i < len(shape) and shape[i] == 1:
            i += 1
        while j < len(source) and source[j] == 1:
            j += 1
        if i == len(shape) or j == len(source):
            return out
        group_i, group_j = [i], [j]
        product_i, product_j = shape[i], source[j]
        while product_i != product_j:
            if product_i < product_j:
                i += 1
                group_i.append(i)
                product_i *= shape[i]
            else:
                j += 1
                group_j.append(j)
                product_j *= source[j]
        sub_shape = tuple(shape[k] for k in group_i)
        sub_source = tuple(source[k] for k in group_j)
        sub_coords = [coords[k] for k in group_i]
        if sub_shape == sub_source:
            found = sub_coords
        else:
            found = unravel(linearize(sub_coords, sub_shape), sub_source, ranges)
        for k, coord in zip(group_j, found, strict=True):
            out[k] = coord
        i, j = i + 1, j + 1


def divisions(expr: Expr) -> int:
    """How many floor divisions and remainders computing `expr` takes."""
    return sum(1 + divisions(atom[1]) for atom, _ in expr.terms if isinstance(atom, tuple))


def render(expr: Expr, name: Mapping[str, str], divide: str = "//") -> str:
    """`expr` as integer arithmetic, symbols written as `name` says; `divide` is the language's
    floor division of non-negative values (Python's and Triton's `//`, C's `/`)."""
    parts = []
    for atom, coef in expr.terms:
        if isinstance(atom, str):
            text = name[atom]
        else:
            kind, inner, k = atom
            operator = divide if kind == "//" else "%"
            text = f"(({render(inner, name, divide)}) {operator} {k})"
        parts.append(text if coef == 1 else f"{text} * {coef}")
    if expr.constant or not parts:
        parts.append(str(expr.constant))
    return " + ".join(parts)


def substitute(expr: Expr, values: Mapping[str, Expr], ranges: Ranges | None = None) -> Expr:
    """`expr` with some symbols replaced by expressions: floor divisions and remainders kept as
    they are written, or, given the `ranges` of the symbols the replacements bring in,
    simplified again with them."""
    out = Expr((), expr.constant)
    for atom, coef in expr.terms:
        if isinstance(atom, str):
            out = out + (values[atom] if atom in values else Expr.of(atom)).scale(coef)
            continue
        kind, inner, k = atom
        inner = substitute(inner, values, ranges)
        if ranges is None:
            out = out + Expr((((kind, inner, k), coef),))
        else:
            out = out + (floordiv if kind == "//" else mod)(inner, k, ranges).scale(coef)
    return out


def unit_stride(offset: Expr, symbol: str, width: int, ranges: Ranges) -> bool:
    """Whether `width` consecutive values of `symbol` from each multiple of `width` are
    `width` consecutive places of `offset`, starting at a multiple of `width` (whatever the
    other symbols are): a vector of `width` elements loaded at once, aligned to its size."""
    size = ranges.sizes[symbol]
    if size % width:
        return False
    whole, part = f"{symbol}__vectors", f"{symbol}__lane"
    inside = Ranges({**ranges.sizes, whole: size // width, part: width})
    split = substitute(offset, {symbol: Expr.of(whole).scale(width) + part}, inside)
    rest = [(atom, coef) for atom, coef in split.terms if atom != part]
    return (dict(split.terms).get(part) == 1
            and all(part not in Expr(((atom, 1),)).symbols() for atom, _ in rest)
            and split.constant % width == 0 and all(coef % width == 0 for _, coef in rest))
