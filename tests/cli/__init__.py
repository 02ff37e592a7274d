"""Tests: /cli"""
