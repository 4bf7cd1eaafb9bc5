"""Tether's benchmarks: each module ``bench/<name>.py`` has ``run(argv) -> None`` and prints a table.

Benchmarks measure and report; they assert nothing about speed.
"""
