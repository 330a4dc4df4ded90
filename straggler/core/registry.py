"""Every straggler method by the name reports and ``--methods`` use."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from straggler.core.method import StragglerMethod
from straggler.core.nurd import PRESETS, make_nurd


def _factories() -> dict[str, Callable[[int], StragglerMethod]]:
    from straggler.core.baselines import BASELINES
    from straggler.core.outliers import OUTLIER_DETECTORS

    out: dict[str, Callable[[int], StragglerMethod]] = {}
    for preset in PRESETS:
        out[preset] = partial(_nurd_preset, preset)
    for name, cls in {**BASELINES, **OUTLIER_DETECTORS}.items():
        out[name] = partial(_with_seed, cls)
    return out


def _nurd_preset(preset: str, seed: int) -> StragglerMethod:
    return make_nurd(preset, random_state=seed)


def _with_seed(cls: type[StragglerMethod], seed: int) -> StragglerMethod:
    try:
        return cls(random_state=seed)  # type: ignore[call-arg]
    except TypeError:
        return cls()


def method_names() -> list[str]:
    return list(_factories())


def make_method(name: str, seed: int = 0) -> StragglerMethod:
    """A fresh, unfitted method; raises KeyError naming the known methods."""
    factories = _factories()
    if name not in factories:
        raise KeyError(f"unknown method {name!r}; known: {', '.join(factories)}")
    return factories[name](seed)


DEFAULT_METHODS = (
    "nurd",
    "nurd-paper",
    "nurd-nc",
    "gbtr",
    "reactive",
    "wrangler",
    "pu-en",
    "pu-bg",
    "tobit",
    "grabit",
    "coxph",
)
