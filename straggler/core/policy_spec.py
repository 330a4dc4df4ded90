"""Policies by name, as the command line, the evaluator and the mitigation consumer spell them.

``speculate``     the cost-aware speculative copies (`straggler.core.speculation`), the default;
``speculate:M``   the same with M spare machines per job;
``relaunch``      the paper's Algorithm 2, kill and restart every flagged task (``unlimited`` is
                  its older name);
``limited:M``     Algorithm 3, kill and restart with M spare machines per job;
``mantri``        Mantri's restart rule.
"""

from __future__ import annotations

from straggler.core.policies import Limited, Mantri, MitigationPolicy, Unlimited
from straggler.core.speculation import Speculate

DEFAULT_POLICY = "speculate"
POLICY_SPECS = "speculate, speculate:M, relaunch (or unlimited), limited:M or mantri"


def make_policy(spec: str, checkpoint_interval: float = 300.0) -> MitigationPolicy:
    """The policy named by ``spec`` (see the module docstring)."""
    if spec in ("relaunch", "unlimited"):
        return Unlimited()
    if spec == "mantri":
        return Mantri(checkpoint_interval)
    if spec == "speculate":
        return Speculate(checkpoint_interval=checkpoint_interval)
    name, _, count = spec.partition(":")
    if name in ("limited", "speculate") and count:
        try:
            machines = int(count)
        except ValueError as error:
            raise ValueError(f"policy {spec!r}: expected {name}:M with an integer M") from error
        if name == "limited":
            return Limited(machines)
        return Speculate(machines=machines, checkpoint_interval=checkpoint_interval)
    raise ValueError(f"unknown policy {spec!r}; use {POLICY_SPECS}")
