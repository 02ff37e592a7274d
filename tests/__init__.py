"""Tests:"""
