"""Every straggler method by the name reports and ``--methods`` use."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from functools import partial
from pathlib import Path

from straggler.core.method import StragglerMethod
from straggler.core.nurd import PRESETS, make_nurd


def _factories() -> dict[str, Callable[[int], StragglerMethod]]:
    from straggler.core.admm import Admm
    from straggler.core.baselines import BASELINES
    from straggler.core.oracle import Oracle
    from straggler.core.outliers import OUTLIER_DETECTORS

    out: dict[str, Callable[[int], StragglerMethod]] = {}
    for preset in PRESETS:
        out[preset] = partial(_nurd_preset, preset)
    for name, cls in {**BASELINES, **OUTLIER_DETECTORS}.items():
        out[name] = partial(_with_seed, cls)
    out["admm"] = partial(_with_seed, Admm)
    out["oracle"] = partial(_with_seed, Oracle)
    from straggler.core.start import StartMethod  # torch is imported only when START trains

    out["start"] = partial(_with_seed, StartMethod)
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


ORACLE = "oracle"
"""The oracle-fed control (future information): evaluation only, never a default, refused by the worker."""


def online_method_names() -> list[str]:
    """The methods a live worker may run: all but the oracle."""
    return [name for name in method_names() if name != ORACLE]


def make_method(name: str, seed: int = 0) -> StragglerMethod:
    """A fresh, unfitted method; raises KeyError naming the known methods."""
    factories = _factories()
    if name not in factories:
        raise KeyError(f"unknown method {name!r}; known: {', '.join(factories)}")
    return factories[name](seed)


def save_trained_method(method: StragglerMethod, path: Path) -> None:
    """Write a method trained across jobs (``straggler train``) for a worker to load."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(method))


def load_trained_method(path: Path, name: str) -> StragglerMethod:
    """Read what `save_trained_method` wrote; the file must hold a trained ``name`` (pickle: trust it)."""
    method = pickle.loads(path.read_bytes())
    if not isinstance(method, StragglerMethod) or method.name != name:
        raise ValueError(f"{path} holds {getattr(method, 'name', type(method).__name__)!r}, not {name!r}")
    return method


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
