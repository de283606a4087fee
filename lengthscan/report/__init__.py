"""Renderers: formatting only, from the audit's ``to_dict()``."""
