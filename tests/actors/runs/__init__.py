"""Tests: /actors/runs"""
