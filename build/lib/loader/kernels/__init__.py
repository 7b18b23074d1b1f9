"""Numba kernels of the plan: small pure functions on arrays and integers.

Each has a plain-Python twin in `tests/reference.py` that the tests compare it with.
"""
