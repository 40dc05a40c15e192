"""Fast, bit-exact CPU kernels for SLAYER CUBA-LIF blocks (lava-dl 0.6.0).

:func:`enable` replaces SLAYER's CPU code paths at run time (module and class attributes
only; no installed file changes) with a small C++ extension (``csrc/``), compiled per
instruction-set variant (:mod:`.variants`); :data:`.patches.PATCHES` lists every patch
point with the tests that prove it bit-identical. Design notes and measurements:
docs/kernels.md, "The kernels package".
"""

from neurofed.kernels.variants import (VARIANTS, build, build_variant, default_variant, is_available,
                                    runnable_variants)
from neurofed.kernels.patches import (GRADIENTS, PATCHES, configure, disable, enable, enabled, gradients,
                                      is_enabled, tune_malloc)

__all__ = ["build", "build_variant", "variant", "runnable_variants", "default_variant", "VARIANTS", "configure",
           "enable", "disable", "enabled", "is_enabled", "is_available", "tune_malloc", "gradients", "GRADIENTS",
           "PATCHES"]


def variant() -> str | None:
    """The instruction-set variant :func:`build` loaded (None before, or if it failed)."""
    from neurofed.kernels import variants

    return variants.variant
