"""The Ray engine: the same measuring and writing units on actors, merged on the driver."""
