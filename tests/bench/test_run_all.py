"""`bench/run_all.py`'s table over several runs: a value per run, and in how many runs a target held."""

from __future__ import annotations

from typing import Any

from bench.run_all import headline_rows


def _startup(*seconds: float | None) -> list[dict[str, dict[str, Any]]]:
    return [{"startup": {} if s is None else {"ours_s": s}} for s in seconds]


def test_one_run_says_met_or_not_met() -> None:
    assert headline_rows(_startup(0.25)) == [("startup", "ours_s", "0.25", "<= 0.3 (met)")]
    assert headline_rows(_startup(0.4)) == [("startup", "ours_s", "0.4", "<= 0.3 (not met)")]


def test_several_runs_show_each_value_and_count_the_runs_that_held() -> None:
    assert headline_rows(_startup(0.25, 0.4, 0.29)) == [
        ("startup", "ours_s", "0.25 / 0.4 / 0.29", "<= 0.3 (met in 2 of 3)")
    ]


def test_a_run_without_the_figure_or_with_the_script_failed_is_not_counted() -> None:
    runs = [*_startup(0.25, None), {"startup": {"error": 1}}]
    assert headline_rows(runs) == [("startup", "ours_s", "0.25 / - / failed", "<= 0.3 (met in 1 of 1)")]


def test_scripts_that_did_not_run_have_no_rows() -> None:
    assert headline_rows([{"nak": {"ours_early": 0}}]) == [
        ("nak", "ours_lateness_p99_ms", "-", ""),
        ("nak", "lateness_p99_ratio_vs_jetstream", "-", ""),
        ("nak", "ours_early", "0", "0 (met)"),
        ("nak", "server_cpu_ratio_vs_jetstream", "-", ""),
    ]
