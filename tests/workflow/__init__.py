"""Tests: /workflow"""
