"""Tests of workflows: the host, its runs handle, outputs and reports."""
