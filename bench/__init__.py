"""Benchmarks run by hand; they print figures and are never collected as tests."""
