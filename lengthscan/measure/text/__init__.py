"""Token lengths: the counter, decide-only bounds, the pre-tokenizer pieces bound, tokenizer loading."""
