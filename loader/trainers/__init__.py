"""Adapters for the trainers that drive a loader their own way (torchtitan)."""
