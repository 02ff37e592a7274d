"""Tests of the node process: gateway, supervision, and several processes racing one node."""
