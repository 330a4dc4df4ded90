"""The cost-aware speculation rule and the survival curve under it (pure, no broker)."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest

from straggler.core.arrays import FloatArray
from straggler.core.online import Decision
from straggler.core.policy_spec import make_policy
from straggler.core.speculation import (
    MIN_PEERS,
    SLOW_MACHINE,
    MantriDuplicate,
    Spark,
    SparkRule,
    Speculate,
    _Job,
    _machine_factors,
    _Running,
    gross_machine_time,
    net_machine_time,
)
from straggler.core.survival import LatencySurvival


def verdict(
    task: str,
    at: float,
    elapsed: float,
    *,
    flagged: bool = False,
    threshold: float = 100.0,
    probability: float = math.nan,
) -> Decision:
    nan = math.nan
    return Decision(
        "job", task, at, elapsed, nan, nan, nan, nan, threshold, flagged, 1, straggle_probability=probability
    )


def finished_job(policy: Speculate, n: int = 95, seed: int = 0) -> None:
    """A job whose ``n`` finished tasks took 50-150 s, started at 0."""
    rng = np.random.default_rng(seed)
    for i, latency in enumerate(rng.uniform(50.0, 150.0, n)):
        policy.on_task_finished("job", f"done-{i}", float(latency), float(latency))


def test_the_survival_curve_steps_on_finished_latencies_and_continues_with_a_tail() -> None:
    curve = LatencySurvival(np.array([10.0, 20.0, 30.0, 40.0]), np.array([25.0, 45.0]))
    assert curve.sf(np.array([5.0, 10.0, 20.0]))[0] == 1.0
    assert curve.sf(np.array([10.0]))[0] == pytest.approx(5 / 6)  # 1 of 6 at risk
    assert curve.last_value == pytest.approx(2 / 9)  # the running task at 45 is censored, not an event
    tail = curve.sf(np.array([40.0, 60.0, 1e6]))
    assert tail[0] == pytest.approx(curve.last_value) and 0 < tail[1] < tail[0] and tail[2] < 1e-9
    grid = np.linspace(0.0, 100.0, 11)
    remaining = curve.remaining_cdf(np.array([5.0, 5.0]), np.array([5.0, 35.0]), grid)
    assert np.all(np.diff(remaining, axis=1) >= 0) and np.all((remaining >= 0) & (remaining <= 1))
    assert np.all(remaining[1] <= remaining[0])  # a lower bound on the latency only delays the end
    assert remaining[1][grid < 30.0].max() == 0.0
    with pytest.raises(ValueError, match="at least one finished"):
        LatencySurvival(np.array([]), np.array([1.0]))


def test_the_last_slow_task_of_a_job_is_copied_and_fresh_ones_are_not() -> None:
    policy = Speculate(checkpoint_interval=10.0)
    finished_job(policy)
    actions = policy.on_checkpoint("job", 400.0, [verdict("slow", 400.0, 400.0, flagged=True)])
    assert [(a.action, a.task_id, a.attempt) for a in actions] == [("duplicate", "slow", 0)]
    busy = Speculate(checkpoint_interval=10.0)
    finished_job(busy, n=10)
    fresh = [verdict(f"new-{i}", 160.0, 5.0) for i in range(200)]
    assert busy.on_checkpoint("job", 160.0, fresh) == []


def test_the_loser_of_a_race_is_killed_at_the_next_checkpoint() -> None:
    policy = Speculate(checkpoint_interval=10.0)
    finished_job(policy)
    policy.on_checkpoint("job", 400.0, [verdict("slow", 400.0, 400.0, flagged=True)])
    policy.on_task_finished("job", "slow", 450.0, 50.0, attempt=1)  # the copy won
    actions = policy.on_checkpoint("job", 460.0, [])
    assert [(a.action, a.task_id, a.attempt, a.decision_key) for a in actions] == [("kill", "slow", 0, 450.0)]
    assert policy.on_checkpoint("job", 470.0, []) == []


def test_a_flag_from_the_predictor_moves_a_copy_earlier() -> None:
    plain = Speculate(machine_price=4.0, checkpoint_interval=10.0)
    told = Speculate(machine_price=4.0, checkpoint_interval=10.0)
    for policy in (plain, told):
        finished_job(policy, n=60)
    running = [verdict(f"r-{i}", 120.0, 100.0) for i in range(20)]
    assert plain.on_checkpoint("job", 120.0, [*running, verdict("x", 120.0, 60.0)]) == []
    flagged = verdict("x", 120.0, 60.0, flagged=True, threshold=1000.0)
    assert [a.task_id for a in told.on_checkpoint("job", 120.0, [*running, flagged])] == ["x"]


def test_no_budget_means_no_copy_and_a_pool_limits_the_races() -> None:
    broke = Speculate(budget=0.0, checkpoint_interval=10.0, stuck_prior=0.0, floor=None)
    finished_job(broke)
    assert broke.on_checkpoint("job", 400.0, [verdict("slow", 400.0, 400.0, flagged=True)]) == []
    pool = Speculate(machines=1, checkpoint_interval=10.0)
    finished_job(pool)
    slow = [verdict(f"slow-{i}", 400.0, 400.0, flagged=True) for i in range(3)]
    first = pool.on_checkpoint("job", 400.0, slow)
    assert len(first) == 1 and first[0].action == "duplicate"
    assert pool.on_checkpoint("job", 410.0, []) == []  # the machine is taken
    pool.on_task_finished("job", first[0].task_id, 415.0, 415.0, attempt=0)  # the original won
    second = pool.on_checkpoint("job", 420.0, [])
    assert [a.action for a in second] == ["kill", "duplicate"]
    assert second[0].attempt == 1  # the copy lost


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"machine_price": 0.0}, "machine_price"),
        ({"budget": -0.1}, "budget"),
        ({"machines": 0}, "at least one machine"),
        ({"grid_points": 2}, "grid_points"),
    ],
)
def test_meaningless_parameters_are_refused(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Speculate(**kwargs)  # type: ignore[arg-type]


def test_policies_by_name() -> None:
    assert make_policy("speculate").name == "speculate"
    assert make_policy("speculate:3").name == "speculate:3"
    assert make_policy("relaunch").name == make_policy("unlimited").name == "unlimited"
    with pytest.raises(ValueError, match="speculate:M with an integer"):
        make_policy("speculate:x")
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("copy-everything")


def test_a_machine_price_is_spelled_after_at() -> None:
    priced = make_policy("speculate:3@6.5", 60.0)
    assert isinstance(priced, Speculate)
    assert (priced.machine_price, priced.machines, priced.checkpoint_interval) == (6.5, 3, 60.0)
    assert priced.name == "speculate:3@6.5"
    assert make_policy("speculate@8").name == "speculate"  # the default price names no price


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("speculate@0", "positive number"),
        ("speculate@nan", "positive number"),
        ("speculate@inf", "positive number"),
        ("speculate@", "a number after '@'"),
        ("speculate@cheap", "a number after '@'"),
        ("spark@0", "multiplier > 0"),
        ("spark@x", "a number after '@'"),
        ("spark:2@4", "spark@MULTIPLIER"),
        ("relaunch@4", "only speculate takes a machine price"),
        ("spark/none", "only speculate takes a floor"),
        ("speculate@4/spark-4", "FLOOR one of spark, spark-legacy, none"),
        ("speculate/gross/none", "[/FLOOR][/gross]"),
        ("speculate/none/none", "[/FLOOR][/gross]"),
        ("speculate//gross", "[/FLOOR][/gross]"),
        ("speculate/", "[/FLOOR][/gross]"),
        ("spark/gross", "only speculate takes a floor, a gross price or late"),
        ("speculate:x@4", "integer M"),
        ("speculate@cheap/none", "a number after '@'"),
        ("speculate:x/gross", "integer M"),
    ],
)
def test_a_meaningless_machine_price_is_refused_naming_the_spec(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as error:
        make_policy(spec)
    assert spec in str(error.value)


def test_a_lower_machine_price_buys_copies_the_default_does_not() -> None:
    """The price reaches the decision: over a range of straggle probabilities for one running task, a
    cheaper policy copies it wherever a dearer one does, and at some probabilities where it does not."""

    def copies(spec: str, probability: float) -> bool:
        policy = make_policy(spec, 10.0)
        assert isinstance(policy, Speculate)
        finished_job(policy, n=60)
        running = [verdict(f"r-{i}", 120.0, 100.0) for i in range(20)]
        told = verdict("x", 120.0, 60.0, threshold=140.0, probability=probability)
        return "x" in [a.task_id for a in policy.on_checkpoint("job", 120.0, [*running, told])]

    probabilities = np.linspace(0.05, 0.95, 19)
    specs = ("speculate@2", "speculate@4", "speculate")
    by_price = [[copies(spec, p) for p in probabilities] for spec in specs]
    for cheaper, dearer in itertools.pairwise(by_price):
        assert all(c or not d for c, d in zip(cheaper, dearer, strict=True))
    assert sum(by_price[0]) > sum(by_price[1]) > 0


def test_mantris_duplicate_test_copies_a_task_likely_to_outlast_two_copies() -> None:
    policy = make_policy("mantri-duplicate", 10.0)
    finished_job(policy)  # type: ignore[arg-type]
    for i in range(5):  # a few tasks took 1000 s: one that has run 400 s is likely one of them
        policy.on_task_finished("job", f"long-{i}", 1000.0 + i, 1000.0 + i)
    slow = verdict("slow", 1100.0, 400.0)
    young = verdict("young", 1100.0, 10.0)
    actions = policy.on_checkpoint("job", 1100.0, [slow, young])
    assert [(a.action, a.task_id) for a in actions] == [("duplicate", "slow")]
    with pytest.raises(ValueError, match="delta"):
        MantriDuplicate(delta=1.5)


def test_a_task_that_failed_no_longer_counts_as_running() -> None:
    policy = Speculate(checkpoint_interval=10.0)
    finished_job(policy)
    policy.on_task_gone("job", "slow", 399.0, attempt=0)  # unknown yet: nothing to forget
    quiet = [verdict(f"r-{i}", 400.0, 20.0) for i in range(5)]
    assert [
        a.task_id for a in policy.on_checkpoint("job", 400.0, [*quiet, verdict("slow", 400.0, 400.0)])
    ] == ["slow"]
    phantom = Speculate(checkpoint_interval=10.0)
    finished_job(phantom)
    phantom.on_checkpoint("job", 100.0, [verdict("dead", 100.0, 90.0)])
    phantom.on_task_gone("job", "dead", 105.0, attempt=0)
    # had "dead" stayed a running task, its ever-growing elapsed time would be what the job waits for
    assert "dead" not in phantom._jobs["job"].running


def test_a_task_that_outruns_its_peers_expects_more_remaining_time_not_less() -> None:
    peers = np.random.default_rng(1).uniform(3.0, 8.0, 39)
    grid = np.linspace(0.0, 2000.0, 4001)

    def expected_remaining(curve: LatencySurvival, elapsed: float) -> float:
        cdf = curve.remaining_cdf(np.array([elapsed]), np.array([elapsed]), grid)[0]
        return float(np.sum(1.0 - cdf) * (grid[1] - grid[0]))

    memoryless = LatencySurvival(peers, np.array([20.0]), stuck_prior=0.0)
    remembering = LatencySurvival(peers, np.array([20.0]), stuck_prior=0.001)
    flat = [expected_remaining(memoryless, e) for e in (20.0, 60.0, 300.0)]
    growing = [expected_remaining(remembering, e) for e in (20.0, 60.0, 300.0)]
    assert max(flat) < 10.0  # "about to finish" at every elapsed time: the hung task is never copied
    assert growing[0] < growing[1] < growing[2] and growing[2] > 1000.0
    assert remembering.stuck_probability(np.array([5.0, 60.0])).tolist()[0] < 0.01
    assert remembering.stuck_probability(np.array([60.0]))[0] > 0.9
    with pytest.raises(ValueError, match="stuck_prior"):
        LatencySurvival(peers, np.array([]), stuck_prior=1.0)


def test_a_probability_moves_the_remaining_time_between_body_and_tail() -> None:
    curve = LatencySurvival(np.linspace(10.0, 100.0, 50), np.array([5.0]))
    grid = np.linspace(0.0, 400.0, 401)
    sure, unsure, never = curve.remaining_cdf(
        np.full(3, 5.0), np.full(3, 5.0), grid, np.array([1.0, 0.5, 0.0]), np.full(3, 90.0)
    )
    assert sure[grid < 85.0].max() == 0.0  # latency >= 90: nothing ends before 85 s more
    assert never[grid >= 85.0].min() == 1.0  # latency < 90: everything has ended by then
    assert np.allclose(unsure, 0.5 * sure + 0.5 * never)
    prior = curve.remaining_cdf(np.full(1, 5.0), np.full(1, 5.0), grid)
    untold = curve.remaining_cdf(np.full(1, 5.0), np.full(1, 5.0), grid, np.array([np.nan]), np.array([90.0]))
    assert np.array_equal(prior, untold)


def test_two_predictors_with_different_probabilities_lead_to_different_commands() -> None:
    def commands(probability: float) -> list[str]:
        policy = Speculate(checkpoint_interval=10.0)
        finished_job(policy, n=40)  # 40 of 100 tasks done: Spark's floor is not in play
        running = [verdict(f"r-{i}", 60.0, 30.0, probability=0.02) for i in range(59)]
        suspect = verdict("x", 60.0, 30.0, threshold=140.0, probability=probability)
        return [a.task_id for a in policy.on_checkpoint("job", 60.0, [*running, suspect])]

    assert commands(0.99) == ["x"]
    assert commands(0.01) == []


def test_a_task_is_priced_by_all_its_verdicts_not_by_its_luckiest_one() -> None:
    """The mean log-odds of an attempt's verdicts is its probability: one confident verdict after
    five doubtful ones buys no copy; the same verdict at the first look does, and so do six."""

    def copies(probabilities: list[float], attempt_changes_at: int | None = None) -> list[int]:
        policy = Speculate(checkpoint_interval=10.0)
        finished_job(policy, n=40)  # 40 of 100 tasks done: Spark's floor is not in play
        looks = []
        for k, probability in enumerate(probabilities):
            at = 60.0 + k
            running = [verdict(f"r-{i}", at, 30.0 + k, probability=0.02) for i in range(59)]
            suspect = verdict("x", at, 30.0 + k, threshold=140.0, probability=probability)
            if attempt_changes_at is not None and k >= attempt_changes_at:
                suspect = dataclasses.replace(suspect, attempt=2)
            actions = policy.on_checkpoint("job", at, [*running, suspect])
            looks += [k for a in actions if a.task_id == "x" and a.action == "duplicate"]
        return looks

    assert copies([0.01] * 5 + [0.99]) == []
    assert copies([0.99]) == [0]
    assert copies([0.99] * 6) == [0]
    assert copies([0.01] * 5 + [0.99], attempt_changes_at=5) == [5]  # a new attempt starts afresh


def hung_job(policy: Speculate) -> float | None:
    """39 tasks of 3-8 s started at 0, one hung; checkpoints every 5 s: when the hung task is copied."""
    latencies = np.random.default_rng(7).uniform(3.0, 8.0, 39)
    for at in np.arange(5.0, 300.0, 5.0).tolist():
        for i, latency in enumerate(latencies):
            if at - 5.0 < latency <= at:
                policy.on_task_finished("job", f"t-{i}", float(latency), float(latency))
        running = [verdict(f"t-{i}", at, at, threshold=7.5) for i, lat in enumerate(latencies) if lat > at]
        hung = verdict(
            "hung", at, at, threshold=7.5, flagged=at >= 10.0, probability=1.0 if at >= 10 else 0.1
        )
        actions = policy.on_checkpoint("job", float(at), [*running, hung])
        if any(a.task_id == "hung" and a.action == "duplicate" for a in actions):
            return float(at)
    return None


def test_the_hung_task_is_copied_by_sparks_rule_and_no_later_by_the_default_policy() -> None:
    legacy = hung_job(make_policy("spark-legacy", 5.0))  # type: ignore[arg-type]
    spark_4 = hung_job(make_policy("spark", 5.0))  # type: ignore[arg-type]
    default = hung_job(make_policy("speculate", 5.0))  # type: ignore[arg-type]
    memoryless = hung_job(Speculate(checkpoint_interval=5.0, stuck_prior=0.0, floor=None))
    assert legacy is not None and legacy <= 15.0  # over 1.5 x the median once 75 % have finished
    median = float(np.median(np.random.default_rng(7).uniform(3.0, 8.0, 39)))
    assert spark_4 is not None and 3 * median < spark_4 <= 3 * median + 5.0  # the next checkpoint past 3 x
    assert default is not None and default <= legacy
    assert memoryless is None  # the exponential tail alone never copies it


def outrun_job(policy: Speculate, at: float) -> list[str]:
    """A job of 95 tasks that took 50-150 s and one that has run ``at`` seconds with no verdict of its
    own: which of them ``policy`` copies at ``at``."""
    finished_job(policy)
    decision = verdict("long", at, at, threshold=140.0)
    return [a.task_id for a in policy.on_checkpoint("job", at, [decision]) if a.action == "duplicate"]


def test_a_gross_price_charges_a_copy_the_net_price_expects_to_pay_for_itself() -> None:
    """A task at ten times its peers' latencies likely hangs, so a winning copy kills an original that
    would run on: priced net, it costs nothing and is made at any price; priced gross, its machine
    time is charged, and only a price low enough for the job's saving buys it."""
    net = Speculate(1e6, checkpoint_interval=10.0, floor=None)
    gross = Speculate(1e6, checkpoint_interval=10.0, floor=None, machine_time=gross_machine_time)
    cheap_gross = Speculate(1.0, checkpoint_interval=10.0, floor=None, machine_time=gross_machine_time)
    assert outrun_job(net, 1500.0) == ["long"]
    assert outrun_job(gross, 1500.0) == []
    assert outrun_job(cheap_gross, 1500.0) == ["long"]
    assert (net.name, gross.name) == ("speculate@1e+06/none", "speculate@1e+06/none/gross")


@pytest.mark.parametrize(
    ("spec", "floor"),
    [
        ("speculate@64/none/gross", None),
        ("speculate@64/spark/gross", SparkRule(3.0, 0.9)),
        ("speculate:2@64/gross", SparkRule(1.5, 0.75)),
    ],
)
def test_a_gross_price_is_spelled_last_and_named(spec: str, floor: SparkRule | None) -> None:
    policy = make_policy(spec)
    assert isinstance(policy, Speculate) and policy.name == spec and policy.floor == floor
    assert policy.machine_time is gross_machine_time
    net = make_policy(spec.removesuffix("/gross"))
    assert isinstance(net, Speculate) and net.machine_time is net_machine_time


@pytest.mark.parametrize(
    ("spec", "multiplier", "quantile"),
    [
        ("spark", 3.0, 0.9),
        ("spark-legacy", 1.5, 0.75),
        ("spark@1.5", 1.5, 0.9),
        ("spark-legacy@3", 3.0, 0.75),
    ],
)
def test_spark_is_spark_4s_rule_the_older_defaults_say_so_and_a_multiplier_keeps_the_quantile(
    spec: str, multiplier: float, quantile: float
) -> None:
    policy = make_policy(spec)
    assert isinstance(policy, Spark) and policy.name == spec
    assert policy.floor == SparkRule(multiplier, quantile)


@pytest.mark.parametrize(
    ("spec", "name", "floor"),
    [
        ("speculate@32/spark", "speculate@32/spark", SparkRule(3.0, 0.9)),
        ("speculate:2/none", "speculate:2/none", None),
        ("speculate/spark-legacy", "speculate", SparkRule(1.5, 0.75)),
    ],
)
def test_speculate_takes_another_floor_after_a_slash_and_names_it(
    spec: str, name: str, floor: SparkRule | None
) -> None:
    policy = make_policy(spec)
    assert isinstance(policy, Speculate) and policy.name == name and policy.floor == floor


def test_sparks_4_rule_waits_for_nine_tenths_of_the_tasks() -> None:
    policy = make_policy("spark", 10.0)
    finished_job(policy, n=60)  # type: ignore[arg-type]
    slow = [verdict(f"s-{i}", 400.0, 400.0) for i in range(20)]
    assert policy.on_checkpoint("job", 400.0, slow) == []  # 60 of 80 finished, all over 3 x the median
    for i in range(11):
        policy.on_task_finished("job", f"s-{i}", 410.0, 410.0)
    assert policy.on_checkpoint("job", 420.0, []) == []  # 71 of 80: under 90 %
    policy.on_task_finished("job", "s-11", 420.0, 420.0)
    copies = policy.on_checkpoint("job", 430.0, [])  # 72 of 80: 90 %
    assert sorted(a.task_id for a in copies) == sorted(f"s-{i}" for i in range(12, 20))


def test_sparks_rule_waits_for_three_quarters_of_the_tasks() -> None:
    policy = make_policy("spark-legacy", 10.0)
    finished_job(policy, n=50)  # type: ignore[arg-type]
    slow = [verdict(f"s-{i}", 400.0, 400.0) for i in range(30)]
    assert policy.on_checkpoint("job", 400.0, slow) == []  # 50 of 80 finished
    for i in range(25):
        policy.on_task_finished("job", f"s-{i}", 410.0, 410.0)
    copies = policy.on_checkpoint("job", 420.0, [])
    assert sorted(a.task_id for a in copies) == [f"s-{i}" for i in range(25, 30)]


def test_a_flagged_task_left_without_a_copy_is_held_with_its_reason_once_per_reason() -> None:
    broke = Speculate(budget=0.0, checkpoint_interval=10.0, stuck_prior=0.0, floor=None)
    finished_job(broke)
    assert (
        broke.on_checkpoint("job", 400.0, [verdict("slow", 400.0, 400.0, flagged=True, probability=0.9)])
        == []
    )
    (hold,) = broke.holds("job")
    assert (hold.task_id, hold.attempt, hold.kind, hold.at) == ("slow", 0, "budget", 400.0)
    assert hold.reason == "no copy: the job's copy budget (0% of its work) is spent (p = 0.90)"
    assert broke.holds("job") == [], "said once"
    broke.on_checkpoint("job", 410.0, [])
    assert broke.holds("job") == [], "the same reason is not said again"

    pricey = Speculate(machine_price=1e6, checkpoint_interval=10.0, stuck_prior=0.0)
    finished_job(pricey, n=50)
    pricey.on_checkpoint("job", 100.0, [verdict("slow", 100.0, 100.0, flagged=True, probability=0.6)])
    (hold,) = pricey.holds("job")
    assert hold.kind == "price" and "not worth its machine time at price 1e+06" in hold.reason
    assert "Spark's rule not met: 98% of tasks finished" not in hold.reason
    assert "Spark's rule not met: ran 100s, not over 1.5 x the median finished latency" in hold.reason

    early = Speculate(checkpoint_interval=10.0)
    early.on_checkpoint("job", 10.0, [verdict("slow", 10.0, 10.0, flagged=True)])
    (hold,) = early.holds("job")
    assert (
        hold.kind == "no_estimate" and "Spark's rule not met: 0% of tasks finished, needs 75%" in hold.reason
    )
    assert not hold.reason.endswith(")"), "no probability: the method gives none"


def test_a_pool_holds_the_flags_it_has_no_machine_for_and_spark_names_its_rule() -> None:
    pool = Speculate(machines=1, checkpoint_interval=10.0)
    finished_job(pool)
    pool.on_checkpoint("job", 400.0, [verdict(f"slow-{i}", 400.0, 400.0, flagged=True) for i in range(3)])
    assert sorted(h.kind for h in pool.holds("job")) == ["machines", "machines"]
    spark = make_policy("spark", 10.0)
    finished_job(spark, n=50)  # type: ignore[arg-type]
    spark.on_checkpoint("job", 400.0, [verdict(f"s-{i}", 400.0, 400.0, flagged=True) for i in range(30)])
    holds = spark.holds("job")
    assert len(holds) == 30 and {h.kind for h in holds} == {"rule"}
    assert holds[0].reason == "no copy: Spark's rule not met: 62% of tasks finished, needs 90%"


def test_a_copys_reason_carries_the_probability_behind_it() -> None:
    policy = Speculate(checkpoint_interval=10.0)
    finished_job(policy)
    (copy,) = policy.on_checkpoint(
        "job", 400.0, [verdict("slow", 400.0, 400.0, flagged=True, probability=0.97)]
    )
    assert copy.reason.startswith("copy: ") and copy.reason.endswith("(p = 0.97)")
    assert policy.holds("job") == []


def short_peers_then_hung(policy: Speculate, spacing: float, probability: float) -> list[int]:
    """The live trial's job (#40): 30 tasks of 2-6 s and one that hangs, all started at 0, evaluated
    every ``spacing`` seconds; from the first evaluation after its peers finished the hung one is
    flagged with ``probability``. Returns the evaluations (0 = that one) at which it was copied."""
    rng = np.random.default_rng(3)
    latencies = rng.uniform(2.0, 6.0, 30)
    copied: list[int] = []
    ended: set[int] = set()
    after = -1
    for at in np.arange(1, 40) * spacing:
        for i, latency in enumerate(latencies):
            if latency <= at and i not in ended:
                ended.add(i)
                policy.on_task_finished("job", f"peer-{i}", float(latency), float(latency))
        running = [verdict(f"peer-{i}", at, at, probability=0.1) for i in range(30) if i not in ended]
        peers_done = not running
        after += peers_done
        hung = verdict(
            "hung", at, at, flagged=peers_done, threshold=5.5, probability=probability if peers_done else 0.1
        )
        actions = policy.on_checkpoint("job", at, [*running, hung])
        copied += [after for a in actions if a.task_id == "hung" and a.action == "duplicate"]
    return copied


@pytest.mark.parametrize("spacing", [1.0, 2.0])
@pytest.mark.parametrize("probability", [0.9, 1.0])
def test_a_confident_flag_on_a_task_whose_peers_finished_is_copied_at_the_next_evaluation(
    spacing: float, probability: float
) -> None:
    """The mitigator's default --checkpoint-seconds (300) must not price a live job's loser as
    running on for 150 s: the job's own evaluation spacing says when it is killed."""
    assert short_peers_then_hung(Speculate(floor=None), spacing, probability)[:1] == [0]


# ---------------------------------------------------------------- a task's input (Mantri's t_new)


def input_job(policy: Speculate, *, inputs: bool = True, follow: bool = True, n: int = 40) -> None:
    """A job whose ``n`` finished tasks took 10 s per unit of input (0.5-2 units), started at 0; with
    ``follow=False`` their inputs are drawn apart from their latencies."""
    rng = np.random.default_rng(3)
    sizes = rng.uniform(0.5, 2.0, n)
    told = sizes if follow else np.random.default_rng(4).permutation(sizes)
    for i, (size, reported) in enumerate(zip(sizes, told, strict=True)):
        latency = float(10.0 * size * rng.uniform(0.95, 1.05))
        policy.on_task_finished("job", f"done-{i}", latency, latency)
        if inputs:
            policy.on_task_input("job", f"done-{i}", float(reported))


def copies(policy: Speculate, running: dict[str, tuple[float, float]], *, at: float = 100.0) -> list[str]:
    """The tasks copied at ``at`` among ``running`` (task -> (elapsed, input)), told their inputs."""
    for task_id, (_, size) in running.items():
        policy.on_task_input("job", task_id, size)
    verdicts = [
        verdict(t, at, elapsed, threshold=20.0, probability=0.9) for t, (elapsed, _) in running.items()
    ]
    return [a.task_id for a in policy.on_checkpoint("job", at, verdicts) if a.action == "duplicate"]


def test_a_task_slow_for_its_large_input_is_not_copied_and_one_slow_for_its_machine_is() -> None:
    """Both ran 45 s of a job whose tasks took 5-20 s; one has 5 units of input (50 s expected, and a
    copy reads the same 5 units), the other 1 unit (10 s expected): only its copy can end sooner."""
    running = {"big-input": (45.0, 5.0), "slow-machine": (45.0, 1.0)}
    told = Speculate(checkpoint_interval=5.0)
    input_job(told)
    assert copies(told, running) == ["slow-machine"]
    blind = Speculate(checkpoint_interval=5.0)  # inputs unknown: both look hung, both are copied
    input_job(blind, inputs=False)
    assert sorted(a.task_id for a in blind.on_checkpoint("job", 100.0, [
        verdict(t, 100.0, e, threshold=20.0, probability=0.9) for t, (e, _) in running.items()
    ]) if a.action == "duplicate") == ["big-input", "slow-machine"]  # fmt: skip


def test_spark_floor_leaves_a_task_a_copy_of_which_cannot_end_first() -> None:
    """Past 1.5 x the median after 75 % finished, Spark's rule names both; with inputs that explain the
    job's latencies the floor copies only the one whose copy is expected to end first."""
    policy = Speculate(checkpoint_interval=5.0, machine_price=1e6)  # the cost rule buys nothing
    input_job(policy)
    assert copies(policy, {"big-input": (30.0, 4.0), "slow-machine": (30.0, 1.0)}) == ["slow-machine"]
    spark = Spark(SparkRule(1.5, 0.75))  # the rule alone is Spark's, blind to inputs: it copies both
    input_job(spark)
    assert copies(spark, {"big-input": (30.0, 4.0), "slow-machine": (30.0, 1.0)}) == [
        "big-input",
        "slow-machine",
    ]


def test_inputs_that_do_not_explain_latency_change_nothing() -> None:
    running = {"a": (45.0, 5.0), "b": (45.0, 1.0), "c": (12.0, 1.0)}
    told, blind = Speculate(checkpoint_interval=5.0), Speculate(checkpoint_interval=5.0)
    input_job(told, follow=False)
    input_job(blind, inputs=False)
    verdicts = [verdict(t, 100.0, e, threshold=20.0, probability=0.9) for t, (e, _) in running.items()]
    assert copies(told, running) == [a.task_id for a in blind.on_checkpoint("job", 100.0, verdicts)]


def test_a_probability_of_a_latency_only_a_hang_reaches_on_the_tasks_scale_does_not_buy_a_copy() -> None:
    """A task with a fifth of the median input, 2 s into its expected 3 s, flagged p = 0.9 against the
    job's 20 s threshold: on its own scale only a hang takes 20 s, which the predictor, learning on raw
    latencies, did not mean."""
    policy = Speculate(checkpoint_interval=5.0)
    input_job(policy)
    assert copies(policy, {"small": (2.0, 0.25), "peer": (2.0, 1.0)}) == []


# ---------------------------------------------------------------- a task's machine (LATE's slow node)


def machine_job(
    policy: Speculate, *, machines: bool = True, slow_finishes: int = 2, slow_seconds: float = 40.0
) -> None:
    """A job whose 40 tasks took 10 s on machines m0-m9, and ``slow_finishes`` took ``slow_seconds``
    on machine "slow"."""
    rng = np.random.default_rng(5)
    finishes = [(f"m{i % 10}", 10.0 * rng.uniform(0.95, 1.05)) for i in range(40)]
    finishes += [("slow", slow_seconds * rng.uniform(0.95, 1.05)) for _ in range(slow_finishes)]
    for i, (machine, latency) in enumerate(finishes):
        if machines:
            policy.on_task_machine("job", f"done-{i}", 0, machine)
        policy.on_task_finished("job", f"done-{i}", float(latency), float(latency))


def copied_on_machines(
    policy: Speculate, running: dict[str, tuple[float, str]], machines: bool, probability: float = math.nan
) -> list[str]:
    """The tasks copied at 100 s among ``running`` (task -> (elapsed, machine)), each given the
    predictor's ``probability`` of passing 20 s (NaN: a method that gives none)."""
    for task_id, (_, machine) in running.items():
        if machines:
            policy.on_task_machine("job", task_id, 0, machine)
    verdicts = [
        verdict(t, 100.0, e, threshold=20.0, probability=probability) for t, (e, _) in running.items()
    ]
    return [a.task_id for a in policy.on_checkpoint("job", 100.0, verdicts) if a.action == "duplicate"]


@pytest.mark.parametrize("probability", [math.nan, 0.02])
@pytest.mark.parametrize("machines", [True, False])
def test_a_task_just_started_on_a_machine_its_job_found_slow_is_copied_at_once(
    machines: bool, probability: float
) -> None:
    """5 s into its run, a task looks like any other, unless the policy knows that its machine took 4x
    as long as the others over this job's tasks: then it is expected to run 4x long (a factor shrunk to
    a little by the job's spread), a copy elsewhere 1x, and the copy pays for itself."""
    running = {"on-slow": (5.0, "slow"), "on-usual": (5.0, "m1")}
    policy = Speculate(checkpoint_interval=5.0, floor=None)
    machine_job(policy, machines=machines)
    # a predictor that sees no more than the task's features says "probably not" (p = 0.02 of passing
    # 20 s, where 2 of the job's 42 tasks did): the odds of what the machine adds multiply its own
    # (`_with_machine_evidence`), they do not lose to it
    expected = ["on-slow"] if machines else []
    assert copied_on_machines(policy, running, machines, probability) == expected


def test_a_machine_is_judged_only_against_enough_tasks_finished_elsewhere() -> None:
    """With fewer than `MIN_PEERS` tasks finished on other machines there is no usual speed to compare a
    machine's with, and its next task is read on the job's curve as any other."""
    policy = Speculate(checkpoint_interval=5.0, floor=None)
    for i, (machine, latency) in enumerate([("m0", 10.0), ("m1", 10.5), ("slow", 40.0), ("slow", 41.0)]):
        policy.on_task_machine("job", f"done-{i}", 0, machine)
        policy.on_task_finished("job", f"done-{i}", latency, latency)
    assert copied_on_machines(policy, {"on-slow": (5.0, "slow")}, machines=True) == []
    assert MIN_PEERS == 3


def machine_state(finishes: list[tuple[str, float]], running_on: str) -> tuple[_Job, FloatArray]:
    """A job whose tasks finished as ``finishes`` (machine, latency), one task running on ``running_on``."""
    job = _Job()
    for i, (machine, latency) in enumerate(finishes):
        job.machines[(f"t{i}", 0)] = machine
        job.finished[f"t{i}"] = latency
    job.running["next"] = _Running(0.0, 0, 0.0)
    job.machines[("next", 0)] = running_on
    return job, np.fromiter(job.finished.values(), dtype=float)


def test_machine_factors_are_shrunk_by_the_spread_within_machines_over_that_between_them() -> None:
    """Log factor = the machine's summed excess over the median elsewhere, over (n + within / between),
    the two variances of a one-way random-effects model of the job's log latencies by machine (method
    of moments), computed here by hand."""
    finishes = [("a", 1.0), ("a", 2.0), ("b", 1.0), ("b", 2.0), ("c", 1.5), ("slow", 6.0), ("slow", 7.0)]
    job, latencies = machine_state(finishes, "slow")
    groups = [np.log([1.0, 2.0]), np.log([1.0, 2.0]), np.log([1.5]), np.log([6.0, 7.0])]
    n, k = 7, 4
    within = sum(float(np.sum((g - g.mean()) ** 2)) for g in groups) / (n - k)
    grand = float(np.mean(np.concatenate(groups)))
    between = sum(len(g) * (g.mean() - grand) ** 2 for g in groups) / (k - 1)
    typical = (n - sum(len(g) ** 2 for g in groups) / n) / (k - 1)
    prior = within / ((between - within) / typical)
    excess = math.log(6.0 / 1.5) + math.log(7.0 / 1.5)
    running = _machine_factors(job, ["next"], latencies)
    assert running == pytest.approx([math.exp(excess / (2 + prior))])
    assert 0 < prior < 1 and running is not None and running[0] >= SLOW_MACHINE
    job.machines[("next", 0)] = "never-seen"  # nothing finished there: nothing to say
    assert _machine_factors(job, ["next"], latencies) is None


def test_no_machine_speed_is_read_where_machines_differ_no_more_than_a_machines_own_tasks() -> None:
    """Each machine's two tasks took 1 s and 8 s, the slow-looking one's 8 s and 9 s: its tasks vary as
    much as machines do, and one finish cannot tell a slow machine from a long task."""
    varied = [(m, s) for m in "abc" for s in (1.0, 8.0)] + [("slow", 8.0), ("slow", 9.0)]
    job, latencies = machine_state(varied, "slow")
    assert _machine_factors(job, ["next"], latencies) is None
    alone = [(f"m{i}", latency) for i, latency in enumerate([1.0, 1.1, 1.2, 0.9, 4.0])]
    job, latencies = machine_state(alone, "m4")  # every task on its own machine: nothing to tell apart
    assert _machine_factors(job, ["next"], latencies) is None
    job, latencies = machine_state([*alone, ("m4", 4.2)], "m4")
    assert _machine_factors(job, ["next"], latencies) == pytest.approx([4.1 / 1.05], rel=0.05)


def test_a_machine_a_little_slower_than_usual_is_read_as_usual() -> None:
    """Its two finishes took 15 s where the job's take 10 s: within `SLOW_MACHINE`, its next task is
    read on the job's curve as any other, and 5 s into its run it is not copied; at 40 s it is."""
    for slow_seconds, expected in ((15.0, []), (40.0, ["on-slow"])):
        policy = Speculate(checkpoint_interval=5.0, floor=None)
        machine_job(policy, slow_seconds=slow_seconds)
        assert copied_on_machines(policy, {"on-slow": (5.0, "slow")}, machines=True) == expected
    usual = [(f"m{i % 10}", 10.0 + 0.1 * (i % 3)) for i in range(40)]
    job, latencies = machine_state([*usual, ("slow", 15.0), ("slow", 15.5)], "slow")
    assert _machine_factors(job, ["next"], latencies) is None
    job, latencies = machine_state([*usual, ("slow", 24.0), ("slow", 24.5)], "slow")
    assert _machine_factors(job, ["next"], latencies) == pytest.approx([2.4], rel=0.03)
    assert SLOW_MACHINE == 2.0


def test_an_original_its_copy_finished_before_tells_how_slow_its_machine_is() -> None:
    """A machine's first task was copied and the copy won: the machine never finished one, but its
    attempt ran 40 s where the job's take 10, so its next task is expected slow and copied at once."""
    policy = Speculate(checkpoint_interval=5.0, floor=None)
    machine_job(policy, slow_finishes=0)
    policy.on_task_machine("job", "first", 0, "slow")
    hung = [verdict("first", 100.0, 60.0, threshold=20.0)]  # 60 s of a job of 10 s tasks: stuck
    assert [a.task_id for a in policy.on_checkpoint("job", 100.0, hung)] == ["first"]
    policy.on_task_machine("job", "first", 1, "m3")
    policy.on_task_finished("job", "first", 110.0, 10.0, attempt=1)  # the copy, 10 s later
    running = {"second": (5.0, "slow"), "peer": (5.0, "m1")}
    assert copied_on_machines(policy, running, machines=True) == ["second"]
    elsewhere = Speculate(checkpoint_interval=5.0, floor=None)  # the same, on another machine
    machine_job(elsewhere, slow_finishes=0)
    elsewhere.on_task_machine("job", "first", 0, "other")
    elsewhere.on_checkpoint("job", 100.0, hung)
    elsewhere.on_task_machine("job", "first", 1, "m3")
    elsewhere.on_task_finished("job", "first", 110.0, 10.0, attempt=1)
    assert copied_on_machines(elsewhere, running, machines=True) == []


# ---------------------------------------------------------------- copies that need no price (#40)


def test_a_likely_straggler_is_copied_before_its_job_has_finished_a_task_and_a_flag_alone_is_not() -> None:
    """No finished task, no curve to price a copy by: a verdict at least 0.9 likely buys one at once,
    outside the budget; a 0.5 verdict and a flag without a probability wait."""
    policy = Speculate(checkpoint_interval=10.0)
    decisions = [
        verdict("likely", 10.0, 10.0, probability=0.95),
        verdict("unsure", 10.0, 10.0, probability=0.5),
        verdict("flagged", 10.0, 10.0, flagged=True),
    ]
    (copy,) = policy.on_checkpoint("job", 10.0, decisions)
    assert (copy.task_id, copy.action) == ("likely", "duplicate")
    assert "a likely straggler before 2 of the job's tasks finished" in copy.reason
    assert copy.reason.endswith("(p = 0.95)")
    assert policy._jobs["job"].spent == 0.0


def test_once_the_curve_is_trusted_a_likely_straggler_is_priced() -> None:
    """The same 0.95 verdict once 95 tasks finished: its copy is bought by the price, and says so."""
    policy = Speculate(checkpoint_interval=10.0)
    finished_job(policy)
    (copy,) = policy.on_checkpoint("job", 10.0, [verdict("likely", 10.0, 10.0, probability=0.95)])
    assert copy.reason.startswith("copy: job ") and "extra machine time" in copy.reason


def sure_copy(elapsed: float, probability: float, priced_after: float = 0.0) -> list[str]:
    """A small job checkpointed every 300 s: 9 tasks of 10-20 s and one of 120 s finished; one task
    ``elapsed`` into its run, said to pass 30 s with ``probability``: the reasons of its copies. A
    copy most likely ends first, but its loser runs on for half the spacing, too dear for the price."""
    policy = Speculate(checkpoint_interval=300.0, floor=None, priced_after=priced_after)
    for i, latency in enumerate([*np.linspace(10.0, 20.0, 9), 120.0]):
        policy.on_task_finished("job", f"done-{i}", float(latency), float(latency))
    decision = verdict("task", 300.0, elapsed, threshold=30.0, probability=probability)
    return [a.reason for a in policy.on_checkpoint("job", 300.0, [decision]) if a.action == "duplicate"]


def test_a_sure_straggler_is_copied_at_once_where_its_copy_is_expected_to_end_first() -> None:
    """Sure to pass 30 s, 10 s in, the task is expected to run about as long as the job's slow
    finish: its copy, a fresh draw, most likely ends first; a likely (0.99) straggler is priced, and
    not worth it. 119 s in, it most likely ends within a second or so, before a copy would."""
    (reason,) = sure_copy(10.0, 0.9999)
    assert "a sure straggler, whose copy likely ends first" in reason
    assert sure_copy(10.0, 0.99) == []
    assert sure_copy(119.0, 0.9999) == []


def sure_normal_job(policy: Speculate, probability: float) -> list[str]:
    """A job whose 95 tasks took 50-150 s; one task 200 s into its run (past 1.5 x the median, and
    the job's every finish), said to pass 500 s with ``probability`` at both its verdicts: which
    tasks are copied."""
    finished_job(policy)
    copied = []
    for at in (190.0, 200.0):
        decision = verdict("long", at, at, threshold=500.0, probability=probability)
        copied += [a.task_id for a in policy.on_checkpoint("job", at, [decision]) if a.action == "duplicate"]
    return copied


@pytest.mark.parametrize("policy", [Speculate(checkpoint_interval=10.0), Speculate(8.0, floor=None)])
def test_a_task_sure_not_to_straggle_is_copied_by_neither_the_price_nor_the_floor(policy: Speculate) -> None:
    """Told twice that the task ends before 500 s with 0.9999, the policy leaves it be; told so with
    0.99, it copies it (by its price, or by Spark's rule over the 1.5 x median); Spark's rule alone
    reads no verdict and copies it either way."""
    assert sure_normal_job(policy, 1e-4) == []
    fresh = Speculate(checkpoint_interval=10.0, floor=policy.floor)
    assert sure_normal_job(fresh, 1e-2) == ["long"]
    assert sure_normal_job(Spark(SparkRule(1.5, 0.75)), 1e-4) == ["long"]


def late_copies(policy: Speculate, elapsed: float, probability: float) -> list[str]:
    """The tasks copied when a flagged task has run ``elapsed`` in a job of 95 finished (median 107 s)."""
    finished_job(policy)
    verdicts = [verdict("slow", elapsed, elapsed, flagged=True, probability=probability)]
    return [a.task_id for a in policy.on_checkpoint("job", elapsed, verdicts) if a.action == "duplicate"]


def test_late_weighs_a_task_only_once_it_has_run_one_and_a_half_times_the_median() -> None:
    """``/late``: the cost rule leaves a task just past its job's body alone, whose remaining time the
    exponential tail overrates, and says why; once it has run 1.5x the median it weighs it as before."""

    def policy(spec: str) -> Speculate:
        made = make_policy(spec, checkpoint_interval=10.0)
        assert isinstance(made, Speculate)
        return made

    assert late_copies(policy("speculate@1/none/gross"), 120.0, 0.6) == ["slow"], "copied without /late"
    late = policy("speculate@1/none/gross/late")
    assert late.priced_after == 1.5 and late.name == "speculate@1/none/gross/late"
    assert late_copies(late, 120.0, 0.6) == []
    (hold,) = late.holds("job")
    assert hold.kind == "rule"
    assert hold.reason == "no copy: ran 120s, under 1.5x the job's median finished latency (107s) (p = 0.60)"
    assert late_copies(policy("speculate@1/none/gross/late"), 170.0, 0.6) == ["slow"]


def test_late_leaves_the_copies_that_need_no_price_and_the_floor_alone() -> None:
    """A sure straggler is copied at once, and Spark's rule copies what it copies, however early for
    the cost rule."""
    (reason,) = sure_copy(10.0, 0.9999, priced_after=1.5)  # 10 s in, the median is 16 s
    assert "a sure straggler, whose copy likely ends first" in reason
    floor = SparkRule(1.1, 0.75)
    assert late_copies(Speculate(1e6, floor=floor, priced_after=1.5), 140.0, 0.6) == ["slow"]
    assert late_copies(Speculate(1e6, floor=None, priced_after=1.5), 140.0, 0.6) == []


@pytest.mark.parametrize(
    "spec", ["speculate/late/gross", "speculate@8/late/spark", "spark/late", "speculate/"]
)
def test_late_is_spelled_last_after_speculates_other_options(spec: str) -> None:
    with pytest.raises(ValueError, match=r"\[/FLOOR\]\[/gross\]\[/late\]"):
        make_policy(spec)


def test_a_negative_priced_after_is_refused() -> None:
    with pytest.raises(ValueError, match="priced_after must be a number >= 0"):
        Speculate(priced_after=-1.0)
