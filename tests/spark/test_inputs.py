"""Which files the storm job reads: a local directory's event logs, a file, a URL left to Spark, and
a local input that is not there refused by name before Spark starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark.events import paths_of


def test_a_directory_stands_for_its_event_logs_in_order(tmp_path: Path) -> None:
    for name in ("events-2.jsonl", "events-1.jsonl", "notes.txt"):
        (tmp_path / name).write_text("")
    single = tmp_path / "other.log"
    single.write_text("")
    assert paths_of([tmp_path, single]) == [
        str(tmp_path / "events-1.jsonl"),
        str(tmp_path / "events-2.jsonl"),
        str(single),
    ]


def test_a_url_is_spark_s_to_read() -> None:
    assert paths_of(["hdfs://namenode/logs/events-1.jsonl"]) == ["hdfs://namenode/logs/events-1.jsonl"]


def test_a_missing_input_is_named(tmp_path: Path) -> None:
    (tmp_path / "events.jsonl").write_text("")
    with pytest.raises(FileNotFoundError, match="gone: no such file or directory"):
        paths_of([tmp_path, tmp_path / "gone"])


def test_a_directory_without_event_logs_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no event-log files \(\*\.jsonl\)"):
        paths_of([tmp_path])
