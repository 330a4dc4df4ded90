"""Policies by name, as the command line, the evaluator and the mitigation consumer spell them.

``speculate``     the cost-aware speculative copies (`straggler.core.speculation`), the default;
``speculate:M``   the same with M spare machines per job;
``speculate@P``   (or ``speculate:M@P``) the same at machine price P: the share of completion time a
                  share of extra machine time must buy (8 by default, docs/results.md §9); a
                  lower price spends more machine time on copies;
``spark``         Spark's speculative execution (a copy of a task running over 1.5x the median
                  finished latency once 75 % of the tasks finished), the floor ``speculate`` keeps;
``relaunch``      the paper's Algorithm 2, kill and restart every flagged task (``unlimited`` is
                  its older name);
``limited:M``     Algorithm 3, kill and restart with M spare machines per job;
``mantri``        Mantri's restart rule;
``mantri-duplicate[:M]``  Mantri's duplicate test (P(remaining > 2 copies) > 0.25) on the same
                  survival estimates as ``speculate``, for comparison.
"""

from __future__ import annotations

from straggler.core.policies import Limited, Mantri, MitigationPolicy, Unlimited
from straggler.core.speculation import MantriDuplicate, Spark, Speculate

DEFAULT_POLICY = "speculate"
POLICY_SPECS = (
    "speculate[:M][@PRICE], spark, relaunch (or unlimited), limited:M, mantri or mantri-duplicate[:M]"
)


def make_policy(spec: str, checkpoint_interval: float = 300.0) -> MitigationPolicy:
    """The policy named by ``spec`` (see the module docstring)."""
    base, priced, price_text = spec.partition("@")
    if priced:
        if base.partition(":")[0] != "speculate":
            raise ValueError(f"policy {spec!r}: only speculate takes a machine price, as speculate[:M]@PRICE")
        try:
            price = float(price_text)
        except ValueError as error:
            raise ValueError(f"policy {spec!r}: expected speculate[:M]@PRICE with a number PRICE") from error
        machines = _speculate_machines(spec, base)
        try:
            return Speculate(price, machines=machines, checkpoint_interval=checkpoint_interval)
        except ValueError as error:
            raise ValueError(f"policy {spec!r}: {error}") from None
    if spec in ("relaunch", "unlimited"):
        return Unlimited()
    if spec == "mantri":
        return Mantri(checkpoint_interval)
    if spec == "spark":
        return Spark()
    if spec == "speculate":
        return Speculate(checkpoint_interval=checkpoint_interval)
    if spec == "mantri-duplicate":
        return MantriDuplicate(checkpoint_interval=checkpoint_interval)
    name, _, count = spec.partition(":")
    if name in ("limited", "speculate", "mantri-duplicate") and count:
        machines = _machines(spec, name, count)
        if name == "limited":
            return Limited(machines)
        if name == "mantri-duplicate":
            return MantriDuplicate(machines=machines, checkpoint_interval=checkpoint_interval)
        return Speculate(machines=machines, checkpoint_interval=checkpoint_interval)
    raise ValueError(f"unknown policy {spec!r}; use {POLICY_SPECS}")


def _machines(spec: str, name: str, count: str) -> int:
    try:
        return int(count)
    except ValueError as error:
        raise ValueError(f"policy {spec!r}: expected {name}:M with an integer M") from error


def _speculate_machines(spec: str, base: str) -> int | None:
    """M of ``speculate:M`` (None for ``speculate``)."""
    _, has_count, count = base.partition(":")
    return _machines(spec, "speculate", count) if has_count else None
