"""Reading the delivery event log into Spark: the explicit schema (from `streaming.observability.event_schema`), the
split into events the analyses use and lines that are counted and reported as bad, and a run's line
(`last_seq`) spelt out as one event per sequence, so the analyses see events only."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from functools import reduce
from pathlib import Path

import attrs
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, DoubleType, LongType, StringType, StructField, StructType

from streaming.observability.event_schema import DELIVERY_REASONS, EVENTS, FIELDS, MAX_RUN, REQUIRED, RUN_EVENTS

CORRUPT = "_corrupt_record"

_SPARK_TYPES: dict[str, DataType] = {"integer": LongType(), "string": StringType(), "number": DoubleType()}

SCHEMA = StructType(
    [StructField(name, _SPARK_TYPES[kind]) for name, (kind, _) in FIELDS.items()] + [StructField(CORRUPT, StringType())]
)

EXAMPLES = 5  # bad lines quoted in the summary, per kind


@attrs.frozen
class Loaded:
    """What `read` found: `events` (the schema's columns but `last_seq`, plus `consumer`; one row per
    event), and bad lines by kind."""

    events: DataFrame
    bad: dict[str, int]
    examples: dict[str, list[str]]


def consumer() -> Column:
    """Who consumes: the queue group or durable name, else `#<sub id>` for a plain subscription (whose
    messages no other subscription shares, so distinct counts stay per subscription)."""
    return F.coalesce(F.col("group"), F.concat(F.lit("#"), F.col("sub").cast("string")))


def _invalid() -> Column:
    """A known event without one of its required fields, or a delivery with an unknown reason."""
    checks = [
        (F.col("event") == kind) & reduce(operator.or_, [F.col(name).isNull() for name in fields])
        for kind, fields in REQUIRED.items()
    ]
    bad_reason = (F.col("event") == "deliver") & ~F.col("reason").isin(*DELIVERY_REASONS)
    run = F.col("last_seq") - F.col("seq")
    bad_run = F.col("last_seq").isNotNull() & (
        ~F.col("event").isin(*RUN_EVENTS) | F.col("seq").isNull() | (run <= 0) | (run >= MAX_RUN)
    )
    return reduce(operator.or_, [*checks, bad_reason, bad_run])


def _each_event(lines: DataFrame) -> DataFrame:
    """One row per event: a good run's line (`last_seq`) becomes a row per sequence from `seq` to
    `last_seq`; every other line stays one row."""
    run = F.col("_bad").isNull() & F.col("last_seq").isNotNull()
    seqs = F.when(run, F.sequence(F.col("seq"), F.col("last_seq"))).otherwise(F.array(F.col("seq")))
    return lines.withColumn("seq", F.explode(seqs))


def paths_of(inputs: Sequence[str | Path]) -> list[str]:
    """Event-log files: a local directory stands for the `*.jsonl` files in it, and a URL (`hdfs://...`)
    is Spark's to read. Raises FileNotFoundError naming a local input that is not there, or when
    there are none."""
    out: list[str] = []
    for item in inputs:
        if "://" in str(item):
            out.append(str(item))
            continue
        path = Path(item)
        if not path.exists():
            raise FileNotFoundError(f"{item}: no such file or directory")
        out += sorted(str(p) for p in path.glob("*.jsonl")) if path.is_dir() else [str(path)]
    if not out:
        raise FileNotFoundError(f"no event-log files (*.jsonl) in {', '.join(map(str, inputs))}")
    return out


def read(spark: SparkSession, inputs: Sequence[str | Path], stage: Path | None = None) -> Loaded:
    """The events in `inputs`, parsed once: into Parquet at `stage` (every line, with `_bad` saying why
    one is left out), else into memory for a small log."""
    raw = (
        spark.read.schema(SCHEMA)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", CORRUPT)
        .json(paths_of(inputs))
    )
    kind = (
        F.when(F.col(CORRUPT).isNotNull(), "malformed")
        .when(F.col("event").isNull() | ~F.col("event").isin(*EVENTS), "unknown_event")
        .when(_invalid(), "invalid")
        .otherwise(None)
    )
    # Runs are spelt out here, once, before the events are staged: not again in every analysis.
    classified = _each_event(raw.withColumn("_bad", kind))
    # Spark refuses a query over only the corrupt-record column of raw JSON; a stored frame is fine.
    if stage is not None:
        classified.write.mode("overwrite").parquet(str(stage))
        classified = spark.read.parquet(str(stage))
    else:
        classified = classified.cache()
    bad_rows = classified.filter(F.col("_bad").isNotNull())
    bad = {row["_bad"]: row["count"] for row in bad_rows.groupBy("_bad").count().collect()}
    examples: dict[str, list[str]] = {}
    for name in bad:
        sample = bad_rows.filter(F.col("_bad") == name).limit(EXAMPLES).collect()
        examples[name] = [row[CORRUPT] or _describe(row.asDict()) for row in sample]
    good = classified.filter(F.col("_bad").isNull()).drop(CORRUPT, "_bad", "last_seq")
    good = good.withColumn("consumer", consumer())
    return Loaded(good, {k: bad.get(k, 0) for k in ("malformed", "unknown_event", "invalid")}, examples)


def _describe(record: dict[str, object]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in record.items() if k in FIELDS and v is not None)
