"""What the CLI tests check of every refusal: one line on stderr, no traceback, the words that matter."""


def one_line(capsys, *words) -> str:
    """The captured stderr, asserted to be one line without a traceback and to hold ``words``."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err
    return err
