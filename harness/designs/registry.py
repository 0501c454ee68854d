"""``run.design`` -> its design: the one place a design name chooses code. A new design is a module that
defines a :class:`~harness.designs.base.Design` and one entry here (its name also goes into
``harness.config.DESIGNS``, which validates configs without importing the designs)."""

from __future__ import annotations

from harness.config import DESIGNS as CONFIG_DESIGNS
from harness.designs import abba, paired
from harness.designs.base import Design

DESIGNS: dict[str, Design] = {d.name: d for d in (abba.DESIGN, paired.DESIGN)}
if tuple(DESIGNS) != CONFIG_DESIGNS:
    raise ImportError(f"harness.config.DESIGNS {CONFIG_DESIGNS} != registered designs {tuple(DESIGNS)}")


def design(name: str) -> Design:
    """The registered design called ``name`` (a config's ``run.design``)."""
    try:
        return DESIGNS[name]
    except KeyError:
        raise ValueError(f"run.design must be one of {tuple(DESIGNS)}, got {name!r}") from None
