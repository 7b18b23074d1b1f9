"""Mixing quality of the clump shuffle, measured over many seeds.

Thresholds: chi-square tests at significance 0.001, with the critical value from the
Wilson-Hilferty approximation (accurate to well under 1 % at these degrees of freedom).
Seeds are fixed, so the tests are deterministic: a pass is not luck on this run, and a
generator with a real bias (say, too few Feistel rounds) fails them every time.
"""

from __future__ import annotations

import math

import numpy as np

from loader.plan import PlanSpec

SEEDS = range(2000)
Z_999 = 3.0902  # standard normal quantile for 0.999


def chi2_critical(dof: int, z: float = Z_999) -> float:
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def chi2(counts: np.ndarray) -> float:
    expected = counts.sum(axis=-1, keepdims=True) / counts.shape[-1]
    return float(((counts - expected) ** 2 / expected).sum())


def test_each_rows_split_and_position_are_uniform() -> None:
    n, splits = 48, 4
    length = n // splits
    split_counts = np.zeros((n, splits))  # (row, destination split)
    position_counts = np.zeros((n, n))  # (row, position in the epoch order)
    for seed in SEEDS:
        order = PlanSpec(n, splits, True, seed, 1).epoch(0).order(np.arange(n))
        split_counts[order, np.arange(n) // length] += 1
        position_counts[order, np.arange(n)] += 1
    assert chi2(split_counts) < chi2_critical(n * (splits - 1))
    assert chi2(position_counts) < chi2_critical(n * (n - 1))


def test_clumps_land_uniformly_across_epochs() -> None:
    """Same seed, successive epochs: each clump's slot in the order is uniform (C=4, ragged tail)."""
    n, clump = 70, 4
    n_clumps = -(-n // clump)
    counts = np.zeros((n_clumps, n_clumps))  # (clump, slot it lands in)
    for epoch in SEEDS:
        order = PlanSpec(n, 5, True, 11, clump).epoch(epoch).order(np.arange(n))
        where = np.empty(n, dtype=np.int64)
        where[order] = np.arange(n)
        slots = np.argsort(np.argsort(where[::clump]))  # rank of each clump's start in the order
        counts[np.arange(n_clumps), slots] += 1
    assert chi2(counts) < chi2_critical(n_clumps * (n_clumps - 1))


def test_neighbours_in_different_clumps_land_far_apart() -> None:
    """Rows r and r+1 across a clump boundary: in a uniform shuffle their distance in the
    order is |U1 - U2| * N, with median (1 - 1/sqrt(2)) N = 0.29 N and P(< 1% N) = 2 %.
    A weak permutation that keeps neighbours near (Mosaic's complaint) fails both bounds."""
    n, clump = 100_000, 10
    spec = PlanSpec(n, 8, True, 5, clump)
    order = spec.epoch(0).order(np.arange(n))
    where = np.empty(n, dtype=np.int64)
    where[order] = np.arange(n)
    last_of_clump = np.arange(clump - 1, n - 1, clump)
    distance = np.abs(where[last_of_clump + 1] - where[last_of_clump])
    assert np.median(distance) > 0.25 * n
    assert np.mean(distance < 0.01 * n) < 0.03
