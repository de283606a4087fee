"""Policy stage: limit rules, the pure per-row decision table, the decide pass, model limits."""
