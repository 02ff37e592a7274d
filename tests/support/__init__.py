"""The test harness: node processes and fixtures, run helpers, the docs runner."""
