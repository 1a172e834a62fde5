"""Loggers. Every run writes metrics.jsonl and summary.json (`RunRecorder`); others add to it."""
