"""Policies by name, as the command line, the evaluator and the mitigation consumer spell them.

``speculate``     the cost-aware speculative copies (`straggler.core.speculation`), the default;
``speculate:M``   the same with M spare machines per job;
``speculate@P``   (or ``speculate:M@P``) the same at machine price P: the share of completion time a
                  share of extra machine time must buy (8 by default, chosen in
                  `git show 96386f7:docs/results.md` §9); a lower price spends more machine time on copies;
``speculate.../F`` the same over floor F instead of ``spark-legacy``: ``spark`` (Spark 4.0's rule) or
                  ``none`` (``speculate@64/spark``, say), to compare it with Spark 4.0's rule at its
                  machine time;
``speculate.../gross`` the same pricing a copy at its gross machine time, with no credit for
                  the original its win kills (`straggler.core.speculation.gross_machine_time`):
                  ``speculate@64/none/gross``;
``speculate.../late`` (last) the same with the cost rule weighing only tasks that have run 1.5x their
                  job's median finished latency (`straggler.core.speculation.LATE`):
                  ``speculate@24/none/gross/late``;
``spark``         Spark's speculative execution at Spark 4.0's defaults: a copy of a task running
                  over 3x the median finished latency once 90 % of the tasks finished;
``spark-legacy``  the same at the defaults before Spark 4.0 (1.5x once 75 % finished), the floor
                  ``speculate`` keeps;
``spark@X``       (or ``spark-legacy@X``) the same rule at multiplier X (its quantile kept): the points
                  of Spark's rule on a curve of completion time against machine time;
``relaunch``      the paper's Algorithm 2, kill and restart every flagged task (``unlimited`` is
                  its older name);
``limited:M``     Algorithm 3, kill and restart with M spare machines per job;
``mantri``        Mantri's restart rule;
``mantri-duplicate[:M]``  Mantri's duplicate test (P(remaining > 2 copies) > 0.25) on the same
                  survival estimates as ``speculate``, for comparison.
"""

from __future__ import annotations

from straggler.core.policies import Limited, Mantri, MitigationPolicy, Unlimited
from straggler.core.speculation import (
    DEFAULT_MACHINE_PRICE,
    LATE,
    SPARK_4,
    SPARK_LEGACY,
    MachineTime,
    MantriDuplicate,
    Spark,
    SparkRule,
    Speculate,
    gross_machine_time,
    net_machine_time,
)

FLOORS: dict[str, SparkRule | None] = {"spark": SPARK_4, "spark-legacy": SPARK_LEGACY, "none": None}
"""The floors ``speculate[...]/FLOOR`` names: Spark's rule at Spark 4.0's or the older defaults, or none."""
DEFAULT_POLICY = "speculate"
POLICY_SPECS = (
    "speculate[:M][@PRICE][/FLOOR][/gross][/late], spark[@MULTIPLIER], spark-legacy[@MULTIPLIER], "
    "relaunch (or unlimited), limited:M, mantri or mantri-duplicate[:M]"
)


def make_policy(spec: str, checkpoint_interval: float = 300.0) -> MitigationPolicy:
    """The policy named by ``spec`` (see the module docstring)."""
    priced_part, slashed, after = spec.partition("/")
    floor, machine_time, priced_after = (
        _speculate_options(spec, priced_part, after) if slashed else (SPARK_LEGACY, net_machine_time, 0.0)
    )
    base, priced, price_text = priced_part.partition("@")
    name, counted, count = base.partition(":")
    if priced and name in ("spark", "spark-legacy") and not counted:
        rule = SPARK_4 if name == "spark" else SPARK_LEGACY
        try:
            return Spark(SparkRule(_price(spec, price_text), rule.quantile))
        except ValueError as error:
            raise ValueError(f"policy {spec!r}: {error}") from None
    if priced and name != "speculate":
        raise ValueError(
            f"policy {spec!r}: only speculate takes a machine price (speculate[:M]@PRICE), and Spark's "
            "rule a multiplier (spark@MULTIPLIER)"
        )
    if counted and name not in ("limited", "speculate", "mantri-duplicate"):
        raise ValueError(f"unknown policy {spec!r}; use {POLICY_SPECS}")
    machines = _machines(spec, name, count) if counted else None
    if name == "speculate":
        price = _price(spec, price_text) if priced else DEFAULT_MACHINE_PRICE
        try:
            return Speculate(
                price,
                machines=machines,
                checkpoint_interval=checkpoint_interval,
                floor=floor,
                machine_time=machine_time,
                priced_after=priced_after,
            )
        except ValueError as error:
            raise ValueError(f"policy {spec!r}: {error}") from None
    if name == "mantri-duplicate":
        return MantriDuplicate(machines=machines, checkpoint_interval=checkpoint_interval)
    if machines is not None:
        return Limited(machines)  # the only other policy with spare machines
    if name in ("relaunch", "unlimited"):
        return Unlimited()
    if name == "mantri":
        return Mantri(checkpoint_interval)
    if name == "spark":
        return Spark(SPARK_4)
    if name == "spark-legacy":
        return Spark(SPARK_LEGACY)
    raise ValueError(f"unknown policy {spec!r}; use {POLICY_SPECS}")


def _speculate_options(
    spec: str, priced_part: str, after: str
) -> tuple[SparkRule | None, MachineTime, float]:
    """The floor, the pricing and ``priced_after`` named after ``speculate[:M][@PRICE]/``: ``FLOOR``,
    ``gross``, ``late``, in that order, each optional (one at least)."""
    options = after.split("/")
    late = options[-1] == "late"
    options = options[:-1] if late else options
    gross = bool(options) and options[-1] == "gross"
    floors = options[:-1] if gross else options
    if (
        not priced_part.startswith("speculate")
        or len(floors) > 1
        or not set(floors) <= FLOORS.keys()
        or not (floors or gross or late)
    ):
        raise ValueError(
            f"policy {spec!r}: only speculate takes a floor, a gross price or late, as "
            f"speculate[:M][@PRICE][/FLOOR][/gross][/late] with FLOOR one of {', '.join(FLOORS)}"
        )
    return (
        FLOORS[floors[0]] if floors else SPARK_LEGACY,
        gross_machine_time if gross else net_machine_time,
        LATE if late else 0.0,
    )


def _machines(spec: str, name: str, count: str) -> int:
    try:
        return int(count)
    except ValueError as error:
        raise ValueError(f"policy {spec!r}: expected {name}:M with an integer M") from error


def _price(spec: str, text: str) -> float:
    try:
        return float(text)
    except ValueError as error:
        raise ValueError(f"policy {spec!r}: expected a number after '@'") from error
