"""The ``lengthscan`` command: parsing and printing only; each subcommand is a library call."""
