"""Orchestration: set-up, the one measuring loop, audit and clean, results; ``ray/`` runs them on a Ray cluster."""
