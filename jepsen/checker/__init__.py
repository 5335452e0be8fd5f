"""Checker for the Kafka queue workload: ``check(history)`` -> results dict (results.json)."""

from jepsen.checker.anomalies import ANOMALY_TYPES, DEFAULT_MAX_EXAMPLES
from jepsen.checker.check import check, read_results, write_results

__all__ = ["ANOMALY_TYPES", "DEFAULT_MAX_EXAMPLES", "check", "read_results", "write_results"]
