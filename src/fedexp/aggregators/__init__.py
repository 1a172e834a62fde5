"""Aggregators: pure functions (stacked updates [n, d], client weights [n]) -> aggregate [d]."""

from fedexp.aggregators.mean import weighted_mean

__all__ = ["weighted_mean"]
