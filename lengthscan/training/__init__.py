"""Training helpers: the Trainer's batches and samplers, length columns and collators, ``Dataset.map`` functions."""
