"""Tests of the command line, in process (CliRunner) and as real processes."""
