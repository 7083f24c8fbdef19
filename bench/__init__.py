"""seqstore benchmarks. Run from the repository root: ``python bench/run_all.py`` (see docs/benchmarks.md)."""
