"""Packing: the packs a trainer will build from the measured lengths, what they waste and lose."""
