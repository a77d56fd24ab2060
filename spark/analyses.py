"""The nine storm analyses, each a function from the event DataFrame (see `spark.events`) to a
DataFrame. Times are integer microseconds (`ts`) in the computations, so bucket and window edges are
exact; the outputs add readable timestamps. A "consumer" is a queue group or durable name, else one
plain subscription; a "redelivery" is a delivery for any reason but `new`."""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable
from typing import Any

import attrs
from pyspark.sql import Column, DataFrame, GroupedData, Window
from pyspark.sql import functions as F

from streaming.observability.event_schema import DELIVERY_REASONS

KEY = ["channel", "consumer"]
REDELIVERY_REASONS = [r for r in DELIVERY_REASONS if r != "new"]
RESTART_FIGURES = (
    "restart",
    "downtime_s",
    "to_first_delivery_s",
    "to_first_new_delivery_s",
    "recovered_redeliveries",
    "duplicates_of_acked",
)


@attrs.frozen
class Settings:
    """Every threshold the analyses use (the command line sets each)."""

    window_s: float = 60.0  # analyses 1, 2, 6
    bucket_s: float = 10.0  # storm buckets (4) and status samples (8)
    storm_k: float = 3.0  # a bucket is hot above k x the rolling median of the buckets before it
    storm_min_redeliveries: int = 10  # ... and above this many redeliveries (a quiet baseline is 0)
    storm_min_buckets: int = 3  # an episode is at least this many hot buckets in a row (w)
    storm_baseline_buckets: int = 30  # the rolling median looks back this many buckets
    poison_attempts: int = 5  # analysis 3: a message delivered this many times is a poison candidate
    fit_ratio: float = 0.8  # analysis 5: flag handler-time p99 above this fraction of AckWait
    status_samples: int = 10  # analysis 8: K samples of bucket_s each

    def __attrs_post_init__(self) -> None:
        for name in ("window_s", "bucket_s", "storm_k", "fit_ratio"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        for name in ("storm_min_buckets", "storm_baseline_buckets", "poison_attempts", "status_samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")

    @property
    def window_us(self) -> int:
        return round(self.window_s * 1e6)

    @property
    def bucket_us(self) -> int:
        return round(self.bucket_s * 1e6)


def _floor_to(ts: Column, width_us: int) -> Column:
    return F.floor(ts / F.lit(width_us)).cast("long") * F.lit(width_us)


def _time(column: str) -> Column:
    return F.expr(f"timestamp_micros({column})")


def _percentile(column: str, p: float) -> Column:
    return F.expr(f"percentile({column}, {p})")


def _redelivery() -> Column:
    return (F.col("reason") != "new").cast("int")


def _first(frame: DataFrame, by: list[str], order: list[Column]) -> DataFrame:
    """The first row of each `by` group in `order`."""
    rank = F.row_number().over(Window.partitionBy(*by).orderBy(*order))
    return frame.withColumn("_rank", rank).filter(F.col("_rank") == 1).drop("_rank")


def deliveries(events: DataFrame) -> DataFrame:
    return events.filter(F.col("event") == "deliver")


def acks(events: DataFrame) -> DataFrame:
    return events.filter(F.col("event") == "ack")


def end_of_log(events: DataFrame) -> int:
    return int(events.agg(F.max("ts")).first()[0] or 0)  # type: ignore[index]


# -- 1. amplification -----------------------------------------------------------------------------


def _amplified(grouped: GroupedData) -> DataFrame:
    return grouped.agg(
        F.count("*").alias("deliveries"),
        F.countDistinct("seq").alias("messages"),
        F.sum(_redelivery()).alias("redeliveries"),
    ).withColumn("amplification", F.col("deliveries") / F.col("messages"))


def amplification(events: DataFrame, s: Settings) -> DataFrame:
    """Per channel, consumer and window: deliveries / distinct messages delivered."""
    d = deliveries(events).withColumn("window_start_us", _floor_to(F.col("ts"), s.window_us))
    return (
        _amplified(d.groupBy(*KEY, "window_start_us"))
        .withColumn("window_start", _time("window_start_us"))
        .orderBy(*KEY, "window_start_us")
    )


def amplification_overall(events: DataFrame) -> DataFrame:
    """The same over the whole log, per channel and consumer."""
    return _amplified(deliveries(events).groupBy(*KEY)).orderBy(*KEY)


# -- 2. redelivery rate and reason mix ------------------------------------------------------------


def redelivery_mix(events: DataFrame, s: Settings) -> DataFrame:
    """Per channel, consumer and window: deliveries by reason, redeliveries per second and their share."""
    d = deliveries(events).withColumn("window_start_us", _floor_to(F.col("ts"), s.window_us))
    mix = d.groupBy(*KEY, "window_start_us").pivot("reason", list(DELIVERY_REASONS)).count().fillna(0)
    redelivered = sum((F.col(r) for r in REDELIVERY_REASONS), F.lit(0))
    return (
        mix.withColumn("deliveries", F.col("new") + redelivered)
        .withColumn("redeliveries", redelivered)
        .withColumn("redeliveries_per_s", F.col("redeliveries") / F.lit(s.window_s))
        .withColumn("redelivery_share", F.col("redeliveries") / F.col("deliveries"))
        .withColumn("window_start", _time("window_start_us"))
        .orderBy(*KEY, "window_start_us")
    )


# -- 3. attempts and poison candidates ------------------------------------------------------------


def attempts(events: DataFrame) -> DataFrame:
    """How many deliveries were attempt 1, 2, ...: per channel and consumer."""
    return (
        deliveries(events)
        .groupBy(*KEY, "attempt")
        .count()
        .withColumnRenamed("count", "deliveries")
        .orderBy(*KEY, "attempt")
    )


def poison(events: DataFrame, s: Settings, end_us: int) -> DataFrame:
    """Messages delivered `poison_attempts` times or more, or never acknowledged by the end of the log
    although their last AckWait had run out (and not dead-lettered)."""
    per_message = (
        deliveries(events)
        .groupBy(*KEY, "seq")
        .agg(
            F.max("attempt").alias("attempts"),
            F.min("ts").alias("first_delivered_us"),
            F.max("ts").alias("last_delivered_us"),
            F.max("ack_wait_s").alias("ack_wait_s"),
        )
    )
    acked = acks(events).select(*KEY, "seq").distinct().withColumn("acked", F.lit(True))
    dead = (
        events.filter(F.col("event") == "dead_letter")
        .select(*KEY, "seq")
        .distinct()
        .withColumn("dead_lettered", F.lit(True))
    )
    m = (
        per_message.join(acked, [*KEY, "seq"], "left")
        .join(dead, [*KEY, "seq"], "left")
        .fillna(False, ["acked", "dead_lettered"])
    )
    too_many = F.col("attempts") >= s.poison_attempts
    expired = F.col("last_delivered_us") + F.col("ack_wait_s") * 1e6 <= F.lit(end_us)
    never_acked = ~F.col("acked") & ~F.col("dead_lettered") & expired
    return (
        m.filter(too_many | never_acked)
        .withColumn(
            "why",
            F.when(too_many & never_acked, "attempts,never_acked").when(too_many, "attempts").otherwise("never_acked"),
        )
        .orderBy(*KEY, "seq")
    )


# -- 4. storm episodes ----------------------------------------------------------------------------


def buckets(events: DataFrame, s: Settings) -> DataFrame:
    """Redeliveries (and deliveries) per consumer per `bucket_s`, with the empty buckets between a
    consumer's first and last delivery filled in, the baseline and whether the bucket is hot.

    The baseline is the median of the `storm_baseline_buckets` latest *calm* buckets: a hot bucket
    never becomes part of it, so a storm is measured against the traffic from before it however long
    it lasts (a rolling median over every bucket would learn the storm and end it after half its
    window). Before a consumer's first delivery its buckets count as quiet (no redeliveries), so a
    storm from its first seconds is measured against quiet. A bucket with no delivery at all (the
    server down for a restart) says nothing: inside an episode it carries the episode on (`carried`),
    and it never enters the baseline."""
    d = deliveries(events).withColumn("bucket", F.floor(F.col("ts") / F.lit(s.bucket_us)).cast("long"))
    counts = d.groupBy(*KEY, "bucket").agg(F.count("*").alias("deliveries"), F.sum(_redelivery()).alias("redeliveries"))
    span = counts.groupBy(*KEY).agg(F.min("bucket").alias("lo"), F.max("bucket").alias("hi"))
    grid = span.select(*KEY, F.explode(F.sequence(F.col("lo"), F.col("hi"))).alias("bucket"))
    dense = (
        grid.join(counts, [*KEY, "bucket"], "left")
        .fillna(0, ["deliveries", "redeliveries"])
        .select(*KEY, "bucket", F.col("deliveries").cast("long"), F.col("redeliveries").cast("long"))
    )
    schema = "channel string, consumer string, bucket long, deliveries long, redeliveries long, " + (
        "baseline double, threshold double, hot boolean, carried boolean"
    )
    rule = (s.storm_baseline_buckets, s.storm_k, s.storm_min_redeliveries)

    # Defined here, not at module level, so that Spark ships it to executors by value: a cluster's
    # workers need not have this package installed.
    def scan(rows: Iterable[Any], rule: tuple[int, float, int]) -> list[tuple[Any, ...]]:
        """One consumer's buckets in order, each with its baseline (median of the latest calm buckets),
        threshold and hot flag (see `buckets`)."""
        length, k, least = rule
        calm: deque[int] = deque([0] * length, maxlen=length)
        out: list[tuple[Any, ...]] = []
        in_storm = False
        for r in sorted(rows, key=lambda r: r[2]):
            channel, consumer, bucket, delivered, redelivered = r
            baseline = float(statistics.median(calm))
            threshold = max(k * baseline, float(least))
            carried = delivered == 0 and in_storm
            hot = carried or redelivered > threshold
            if not hot and delivered:
                calm.append(redelivered)
            in_storm = hot
            out.append((channel, consumer, bucket, delivered, redelivered, baseline, threshold, hot, carried))
        return out

    scanned = dense.rdd.map(lambda r: ((r[0], r[1]), r)).groupByKey().flatMap(lambda kv: scan(kv[1], rule))
    return dense.sparkSession.createDataFrame(scanned, schema).withColumn(
        "bucket_start_us", F.col("bucket") * F.lit(s.bucket_us)
    )


def episodes(events: DataFrame, bucketed: DataFrame, s: Settings) -> DataFrame:
    """Runs of at least `storm_min_buckets` hot buckets: start, end, peak and total redeliveries,
    amplification during the episode and the most common redelivery reason."""
    hot = bucketed.filter("hot")
    in_order = Window.partitionBy(*KEY).orderBy("bucket")
    runs = (
        hot.withColumn("run", F.col("bucket") - F.row_number().over(in_order))
        .groupBy(*KEY, "run")
        .agg(
            F.min("bucket").alias("first_bucket"),
            F.max(F.when(~F.col("carried"), F.col("bucket"))).alias("last_bucket"),  # not a trailing gap
            F.sum(F.when(F.col("carried"), 0).otherwise(1)).alias("buckets"),
            F.max("redeliveries").alias("peak_redeliveries"),
            F.sum("redeliveries").alias("redeliveries"),
        )
        .filter(F.col("buckets") >= s.storm_min_buckets)
        .withColumn("start_us", F.col("first_bucket") * F.lit(s.bucket_us))
        .withColumn("end_us", (F.col("last_bucket") + 1) * F.lit(s.bucket_us))
        .drop("run")
    )
    d = deliveries(events).select(*KEY, "ts", "seq", "reason")
    inside = (
        runs.select(*KEY, "start_us", "end_us")
        .join(d, KEY)
        .filter((F.col("ts") >= F.col("start_us")) & (F.col("ts") < F.col("end_us")))
    )
    amp = inside.groupBy(*KEY, "start_us").agg(
        (F.count("*") / F.countDistinct("seq")).alias("amplification"), F.count("*").alias("deliveries")
    )
    by_reason = inside.filter(F.col("reason") != "new").groupBy(*KEY, "start_us", "reason").count()
    dominant = _first(by_reason, [*KEY, "start_us"], [F.desc("count"), F.col("reason")]).select(
        *KEY, "start_us", F.col("reason").alias("dominant_reason")
    )
    found = runs.join(amp, [*KEY, "start_us"], "left").join(dominant, [*KEY, "start_us"], "left")
    return (
        _with_cause(events, found, s)
        .withColumn("start", _time("start_us"))
        .withColumn("end", _time("end_us"))
        .withColumn("duration_s", (F.col("end_us") - F.col("start_us")) / 1e6)
        .orderBy(*KEY, "start_us")
    )


CAUSES = ("takeover", "restart", "member left", "slow consumer")


def _with_cause(events: DataFrame, found: DataFrame, s: Settings) -> DataFrame:
    """Each episode's cause, from the records around it: a fault-tolerance takeover (an `ft_takeover`
    shortly before or during it), else a restart (a `server_start`), else what its redeliveries say:
    queue members leaving (`member_left`) or a consumer slower than its AckWait (`ack_timeout`);
    else its dominant reason as it is."""
    marks = events.filter(F.col("event").isin("server_start", "ft_takeover")).select(
        F.col("ts").alias("mark_us"), F.col("event").alias("mark")
    )
    lookback = F.lit(2 * s.bucket_us)  # redeliveries of what was pending follow a start within moments
    near = (
        found.select(*KEY, "start_us", "end_us")
        .join(F.broadcast(marks), F.col("mark_us").between(F.col("start_us") - lookback, F.col("end_us") - 1))
        .groupBy(*KEY, "start_us")
        .agg(
            F.max((F.col("mark") == "ft_takeover").cast("int")).alias("takeovers"),
            F.count("*").alias("starts"),
        )
    )
    reason = F.col("dominant_reason")
    cause = (
        F.when(F.col("takeovers") == 1, F.lit("takeover"))
        .when(F.col("starts") > 0, F.lit("restart"))
        .when(reason == "member_left", F.lit("member left"))
        .when(reason == "ack_timeout", F.lit("slow consumer"))
        .otherwise(F.coalesce(reason, F.lit("unknown")))
    )
    return found.join(near, [*KEY, "start_us"], "left").withColumn("cause", cause).drop("takeovers", "starts")


# -- 5. AckWait fit -------------------------------------------------------------------------------


def handled(events: DataFrame) -> DataFrame:
    """Each ack with the message's first delivery to the consumer and its first redelivery. The server
    cannot tell which copy a client acknowledged (an ack names only the sequence), so handler time is
    measured from the first delivery: how long the consumer held the message, which is what AckWait
    must cover."""
    d = (
        deliveries(events)
        .groupBy(*KEY, "seq")
        .agg(
            F.min("ts").alias("delivered_us"),
            F.min(F.when(F.col("attempt") > 1, F.col("ts"))).alias("redelivered_us"),
            F.max("ack_wait_s").alias("ack_wait_s"),
        )
    )
    a = acks(events).select(*KEY, "seq", F.col("ts").alias("acked_us"))
    return a.join(d, [*KEY, "seq"]).withColumn("handler_s", (F.col("acked_us") - F.col("delivered_us")) / 1e6)


def ack_wait_fit(events: DataFrame, s: Settings, acked: DataFrame | None = None) -> DataFrame:
    """Per consumer: handler time (ack - first delivery) p50/p99 against AckWait, the late-ack fraction
    (acks that came after the message had already been sent again), a flag when p99 > fit_ratio x
    AckWait, and an AckWait, or else a MaxInflight, that would have kept p99 under it.

    Handler time as the server sees it includes the time a message waited in the client behind the
    others in flight; the per-message service time is the median gap between one member's acks."""
    late = (acked if acked is not None else handled(events)).withColumn(
        "late", F.coalesce((F.col("redelivered_us") < F.col("acked_us")).cast("int"), F.lit(0))
    )
    gaps = (
        acks(events)
        .withColumn("gap_s", (F.col("ts") - F.lag("ts").over(Window.partitionBy(*KEY, "sub").orderBy("ts"))) / 1e6)
        .groupBy(*KEY)
        .agg(_percentile("gap_s", 0.5).alias("service_s"))
    )
    fit = (
        late.groupBy(*KEY)
        .agg(
            F.count("*").alias("acks"),
            _percentile("handler_s", 0.5).alias("handler_p50_s"),
            _percentile("handler_s", 0.99).alias("handler_p99_s"),
            F.max("ack_wait_s").alias("ack_wait_s"),
            F.avg("late").alias("late_ack_fraction"),
        )
        .join(gaps, KEY, "left")
    )
    flagged = F.col("handler_p99_s") > F.lit(s.fit_ratio) * F.col("ack_wait_s")
    return (
        fit.withColumn("flagged", flagged)
        .withColumn(
            "recommended_ack_wait_s",
            F.when(flagged, F.ceil(F.col("handler_p99_s") / F.lit(s.fit_ratio))).otherwise(F.col("ack_wait_s")),
        )
        .withColumn(
            "recommended_max_inflight",
            F.when(
                flagged & (F.col("service_s") > 0),
                F.greatest(F.lit(1), F.floor(F.lit(s.fit_ratio) * F.col("ack_wait_s") / F.col("service_s"))),
            ).cast("long"),
        )
        .orderBy(*KEY)
    )


def handler_times(acked: DataFrame) -> DataFrame:
    """Per ack (from `handled`): when it came, how long the message was held and the AckWait."""
    return acked.select(*KEY, "acked_us", "handler_s", "ack_wait_s")


# -- 6. queue-member skew -------------------------------------------------------------------------


def member_skew(events: DataFrame, s: Settings) -> DataFrame:
    """Per queue group and window: deliveries per member, max/mean, coefficient of variation and the
    largest member's share of the group's redeliveries. Queue groups are the consumers with member
    events or more than one member delivered to."""
    d = deliveries(events).filter(F.col("group").isNotNull())
    with_members = events.filter(F.col("event").isin("member_join", "member_leave")).select(*KEY).distinct()
    several = d.groupBy(*KEY).agg(F.countDistinct("sub").alias("n")).filter(F.col("n") > 1).select(*KEY)
    groups = with_members.union(several).distinct()
    per_member = (
        d.join(groups, KEY)
        .withColumn("window_start_us", _floor_to(F.col("ts"), s.window_us))
        .groupBy(*KEY, "window_start_us", "sub", "member")
        .agg(F.count("*").alias("deliveries"), F.sum(_redelivery()).alias("redeliveries"))
    )
    top_member = _first(per_member, [*KEY, "window_start_us"], [F.desc("redeliveries"), F.col("sub")]).select(
        *KEY, "window_start_us", F.col("member").alias("top_redelivery_member")
    )
    return (
        per_member.groupBy(*KEY, "window_start_us")
        .agg(
            F.count("*").alias("members"),
            F.sum("deliveries").alias("deliveries"),
            F.max("deliveries").alias("max_deliveries"),
            F.avg("deliveries").alias("mean_deliveries"),
            F.stddev_pop("deliveries").alias("stddev_deliveries"),
            F.sum("redeliveries").alias("redeliveries"),
            F.max("redeliveries").alias("max_member_redeliveries"),
        )
        .withColumn("max_over_mean", F.col("max_deliveries") / F.col("mean_deliveries"))
        .withColumn("cv", F.col("stddev_deliveries") / F.col("mean_deliveries"))
        .withColumn(
            "top_redelivery_share",
            F.when(F.col("redeliveries") > 0, F.col("max_member_redeliveries") / F.col("redeliveries")),
        )
        .join(top_member, [*KEY, "window_start_us"])
        .withColumn("top_redelivery_member", F.when(F.col("redeliveries") > 0, F.col("top_redelivery_member")))
        .withColumn("window_start", _time("window_start_us"))
        .orderBy(*KEY, "window_start_us")
    )


# -- 7. member-leave bursts -----------------------------------------------------------------------


def leave_bursts(events: DataFrame) -> DataFrame:
    """Per member leave: the member_left redeliveries of its group within 2 x AckWait of the leave,
    how many members they went to, and the drain time (until the last of them was acknowledged; null
    while any is unacknowledged at the end of the log)."""
    leaves = events.filter(F.col("event") == "member_leave").select(
        *KEY, F.col("ts").alias("left_us"), F.col("member").alias("left_member"), F.col("sub").alias("left_sub")
    )
    d = deliveries(events)
    ack_wait = d.groupBy(*KEY).agg(F.max("ack_wait_s").alias("ack_wait_s"))
    moved = d.filter(F.col("reason") == "member_left").select(
        F.col("channel").alias("m_channel"), F.col("consumer").alias("m_consumer"), "seq", "ts", "sub"
    )
    with_wait = leaves.join(ack_wait, KEY, "left")
    # The time window is part of the join, so a leave with no redelivery in it still has its row.
    within = (
        (F.col("channel") == F.col("m_channel"))
        & (F.col("consumer") == F.col("m_consumer"))
        & (F.col("ts") >= F.col("left_us"))
        & (F.col("ts") <= F.col("left_us") + F.lit(2e6) * F.coalesce(F.col("ack_wait_s"), F.lit(0.0)))
    )
    burst = with_wait.join(moved, within, "left").drop("m_channel", "m_consumer")
    first_ack = (
        burst.filter(F.col("seq").isNotNull())
        .select(*KEY, "left_us", "seq")
        .distinct()
        .join(acks(events).select(*KEY, "seq", F.col("ts").alias("acked_us")), [*KEY, "seq"], "left")
        .filter(F.col("acked_us").isNull() | (F.col("acked_us") >= F.col("left_us")))
        .groupBy(*KEY, "left_us", "seq")
        .agg(F.min("acked_us").alias("acked_us"))
        .groupBy(*KEY, "left_us")
        .agg(
            F.max("acked_us").alias("last_acked_us"),
            F.sum(F.col("acked_us").isNull().cast("int")).alias("unacked"),
        )
    )
    return (
        burst.groupBy(*KEY, "left_us", "left_member", "left_sub", "ack_wait_s")
        .agg(
            F.count("seq").alias("redelivered"),
            F.countDistinct("sub").alias("to_members"),
            ((F.min("ts") - F.first("left_us")) / 1e6).alias("first_redelivery_s"),
            ((F.max("ts") - F.first("left_us")) / 1e6).alias("last_redelivery_s"),
        )
        .join(first_ack, [*KEY, "left_us"], "left")
        .fillna(0, ["unacked"])
        .withColumn(
            "drain_s",
            F.when(F.col("redelivered") == 0, F.lit(0.0)).when(
                F.col("unacked") == 0, (F.col("last_acked_us") - F.col("left_us")) / 1e6
            ),
        )
        .withColumn("left_at", _time("left_us"))
        .drop("last_acked_us")
        .orderBy(*KEY, "left_us")
    )


# -- 8. Burrow-style status -----------------------------------------------------------------------


def status_samples(events: DataFrame, s: Settings, end_us: int) -> DataFrame:
    """Per consumer and `bucket_s` sample from its first delivery to the end of the log: deliveries,
    acks, and lag (messages on the channel from the first one it was sent, not yet acknowledged), and
    the status over the last `status_samples` samples, in the manner of Burrow's evaluation rules:
    OK (lag reached zero, or is not growing), WARN (acks move but lag grew at every sample), STALL
    (deliveries but no acks), STOP (nothing at all while lag > 0)."""
    width = s.bucket_us
    bucket = F.floor(F.col("ts") / F.lit(width)).cast("long")
    end_bucket = end_us // width
    d = deliveries(events).withColumn("bucket", bucket)
    a = acks(events).withColumn("bucket", bucket)
    start = d.groupBy(*KEY).agg(F.min("bucket").alias("lo"), F.min("seq").alias("first_seq"))
    grid = start.select(*KEY, "first_seq", F.explode(F.sequence("lo", F.lit(end_bucket))).alias("bucket"))
    sent = d.groupBy(*KEY, "bucket").agg(F.count("*").alias("deliveries"))
    acked = a.groupBy(*KEY, "bucket").agg(F.count("*").alias("acks"))
    stored = (
        events.filter(F.col("event").isin("publish", "deliver"))
        .withColumn("bucket", bucket)
        .groupBy("channel", "bucket")
        .agg(F.max("seq").alias("max_seq"))
    )
    # The channel's highest sequence by the end of each sample: a running max over the channel's
    # samples and the buckets with events, merged (linear in both, unlike a range join).
    by_channel = Window.partitionBy("channel").orderBy("bucket").rowsBetween(Window.unboundedPreceding, 0)
    upto = (
        grid.select("channel", "bucket")
        .distinct()
        .join(stored, ["channel", "bucket"], "full")
        .withColumn("last_seq", F.max("max_seq").over(by_channel))
        .select("channel", "bucket", "last_seq")
    )
    so_far = Window.partitionBy(*KEY).orderBy("bucket").rowsBetween(Window.unboundedPreceding, 0)
    last_k = Window.partitionBy(*KEY).orderBy("bucket").rowsBetween(-(s.status_samples - 1), 0)
    in_order = Window.partitionBy(*KEY).orderBy("bucket")
    samples = (
        grid.join(sent, [*KEY, "bucket"], "left")
        .join(acked, [*KEY, "bucket"], "left")
        .join(upto, ["channel", "bucket"], "left")
        .fillna(0, ["deliveries", "acks"])
        .withColumn("acked_total", F.sum("acks").over(so_far))
        .withColumn(
            "lag",
            F.greatest(
                F.lit(0),
                F.coalesce(F.col("last_seq"), F.col("first_seq")) - F.col("first_seq") + 1 - F.col("acked_total"),
            ),
        )
        .withColumn("grew", (F.col("lag") > F.lag("lag").over(in_order)).cast("int"))
        .withColumn("min_lag", F.min("lag").over(last_k))
        .withColumn("acks_k", F.sum("acks").over(last_k))
        .withColumn("deliveries_k", F.sum("deliveries").over(last_k))
        .withColumn("grew_k", F.sum(F.coalesce(F.col("grew"), F.lit(0))).over(last_k))
        .withColumn("samples_k", F.count("*").over(last_k))
    )
    status = (
        F.when(F.col("min_lag") == 0, "OK")
        .when((F.col("deliveries_k") == 0) & (F.col("acks_k") == 0), "STOP")
        .when(F.col("acks_k") == 0, "STALL")
        .when((F.col("samples_k") > 1) & (F.col("grew_k") >= F.col("samples_k") - 1), "WARN")
        .otherwise("OK")
    )
    return (
        samples.withColumn("status", status)
        .withColumn("sample_start_us", F.col("bucket") * F.lit(width))
        .withColumn("sample_start", _time("sample_start_us"))
        .select(*KEY, "bucket", "sample_start_us", "sample_start", "deliveries", "acks", "lag", "status")
        .orderBy(*KEY, "bucket")
    )


def status_now(samples: DataFrame) -> DataFrame:
    """Each consumer's status at its last sample (the end of the log)."""
    return _first(samples, KEY, [F.desc("bucket")]).select(*KEY, "lag", "status").orderBy(*KEY)


# -- 9. restart cost ------------------------------------------------------------------------------


def restarts(events: DataFrame) -> DataFrame:
    """Per server start: the time since the event before it (downtime, for a restart), from the start
    to the first delivery and the first new delivery, redeliveries of recovered messages, and
    duplicates: deliveries after the start of messages acknowledged before it."""
    starts = events.filter(F.col("event") == "server_start").select(F.col("ts").alias("start_us"))
    # Every event is tagged with the period it falls in (from one start to the next); events before
    # the first start fall in a period that starts at the beginning of time. Periods are few, so
    # they are broadcast and the tagging is one pass over the events.
    before_all = events.sparkSession.createDataFrame([(_BEGINNING,)], "start_us long")
    periods = starts.union(before_all).withColumn("next_us", F.lead("start_us").over(Window.orderBy("start_us")))
    in_period = (F.col("ts") >= F.col("start_us")) & (F.col("next_us").isNull() | (F.col("ts") < F.col("next_us")))
    tagged = events.filter(F.col("event") != "server_start").join(F.broadcast(periods), in_period)
    last = tagged.groupBy("next_us").agg(F.max("ts").alias("previous_us")).withColumnRenamed("next_us", "start_us")
    d = tagged.filter(F.col("event") == "deliver").filter(F.col("start_us") != _BEGINNING)
    firsts = d.groupBy("start_us").agg(
        F.min("ts").alias("first_delivery_us"),
        F.min(F.when(F.col("reason") == "new", F.col("ts"))).alias("first_new_delivery_us"),
        F.sum(F.col("reason").isin("restart", "resume").cast("int")).alias("recovered_redeliveries"),
    )
    acked = acks(events).select(*KEY, "seq", F.col("ts").alias("acked_us"))
    dupes = (
        d.select("start_us", *KEY, "seq", "ts")
        .join(acked, [*KEY, "seq"])
        .filter(F.col("acked_us") < F.col("start_us"))
        .select("start_us", *KEY, "seq", "ts")
        .distinct()
        .groupBy("start_us")
        .agg(F.count("*").alias("duplicates_of_acked"))
    )
    return (
        starts.join(last, "start_us", "left")
        .join(firsts, "start_us", "left")
        .join(dupes, "start_us", "left")
        .fillna(0, ["recovered_redeliveries", "duplicates_of_acked"])
        .withColumn("restart", F.col("previous_us").isNotNull())
        .withColumn("downtime_s", (F.col("start_us") - F.col("previous_us")) / 1e6)
        .withColumn("to_first_delivery_s", (F.col("first_delivery_us") - F.col("start_us")) / 1e6)
        .withColumn("to_first_new_delivery_s", (F.col("first_new_delivery_us") - F.col("start_us")) / 1e6)
        .withColumn("started_at", _time("start_us"))
        .select("started_at", "start_us", *RESTART_FIGURES)
        .orderBy("start_us")
    )


_BEGINNING = -(2**63)
