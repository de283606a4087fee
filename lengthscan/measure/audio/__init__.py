"""Audio lengths from container headers, and model frames by arithmetic."""
