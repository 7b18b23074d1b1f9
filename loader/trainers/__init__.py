"""Adapters for the trainers that drive a loader their own way: torchtitan (`torchtitan`),
Hugging Face's Trainer (`hf`, imports transformers), and the refusal of a second sharding
by a framework's wrapper (`resharding`). docs/trainers.md covers every trainer."""
