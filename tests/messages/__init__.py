"""Tests: /messages"""
