"""Tests: /support"""
