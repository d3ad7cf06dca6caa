"""Targets: trusted adapters over real benchmarks, presented as trace-gym text envs."""
