"""Source stage: open files, globs, folders and hub ids as splits with row identity; scan them; sample rows.

At the bottom of the stages, it also holds what every stage above shares: Arrow arrays built from
buffers (``arrays``) and the cache folder (``cache_dir``).
"""
