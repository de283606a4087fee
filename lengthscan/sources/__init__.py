"""Source stage: open files, globs, folders and hub ids as splits with row identity; scan them; sample rows."""
