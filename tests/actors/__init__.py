"""Tests: /actors"""
