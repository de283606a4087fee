"""Stats stage: exact mergeable histograms, split tallies, and the audit's result records."""
