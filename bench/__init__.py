"""Benchmarks (`python -m bench`). Each module with `main() -> str` reports one markdown section;
nothing here is a test and nothing here asserts."""
