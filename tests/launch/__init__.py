"""Tests: /launch"""
