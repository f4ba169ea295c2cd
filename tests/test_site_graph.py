"""A site's constants written back as Python, and its own values refused where a constant is
needed."""

from __future__ import annotations

import pytest

from generators.site_graph import Ref, Unsupported, constant_source


def test_a_constant_is_written_as_python():
    assert constant_source((1, (2, 3)), "a size") == "(1, (2, 3))"
    assert constant_source("same", "a padding") == "'same'"


@pytest.mark.parametrize("value", [Ref(0, False), (1, (Ref(2, True), 3))],
                         ids=["a value", "a value nested in a tuple"])
def test_a_site_value_is_unsupported(value):
    with pytest.raises(Unsupported, match="a size that is a tensor"):
        constant_source(value, "a size that is a tensor")
