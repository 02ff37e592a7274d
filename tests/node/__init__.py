"""Tests: /node"""
