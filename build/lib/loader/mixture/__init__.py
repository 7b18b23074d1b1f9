"""Mixtures: several datasets at set proportions (MixedDataset), their plan, stream, reader and state."""
