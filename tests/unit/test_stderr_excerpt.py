"""Unit layer: what a failed worker's last stderr lines say of its failure (:func:`xlarun.failures.stderr_excerpt`)."""

from __future__ import annotations

from xlarun.failures import QUOTED_STDERR_LINES, stderr_excerpt

WARNING = ["/srv/train.py:3: UserWarning: deprecated", "  warnings.warn(warn_msg)"]
FIRST = [
    "Traceback (most recent call last):",
    '  File "/srv/train.py", line 9, in load',
    "    table[key]",
    "KeyError: 'step'",
]
SECOND = [
    "Traceback (most recent call last):",
    '  File "/srv/train.py", line 12, in <module>',
    "    load()",
    "RuntimeError: no step",
]


def test_the_last_traceback_is_quoted_from_its_first_line_to_the_end() -> None:
    tail = [*WARNING, *SECOND, "[W] a note written after it"]
    assert stderr_excerpt(tail) == "\n".join([*SECOND, "[W] a note written after it"])


def test_a_chained_traceback_is_quoted_with_the_exceptions_before_it() -> None:
    for chaining in (
        "During handling of the above exception, another exception occurred:",
        "The above exception was the direct cause of the following exception:",
    ):
        chain = [*FIRST, "", chaining, "", *SECOND]
        assert stderr_excerpt([*WARNING, *chain]) == "\n".join(chain)


def test_an_earlier_traceback_that_is_not_chained_is_left_out() -> None:
    assert stderr_excerpt([*FIRST, "retrying", *SECOND]) == "\n".join(SECOND)


def test_an_exception_group_traceback_is_found() -> None:
    group = [
        "  + Exception Group Traceback (most recent call last):",
        '  |   File "/srv/train.py", line 5, in <module>',
        "  | ExceptionGroup: two (2 sub-exceptions)",
        "  +-+---------------- 1 ----------------",
        "    | Traceback (most recent call last):",
        "    | ValueError: a",
    ]
    assert stderr_excerpt([*WARNING, *group]) == "\n".join(group)


def test_without_a_traceback_the_last_lines_are_quoted() -> None:
    tail = [f"line {number}" for number in range(QUOTED_STDERR_LINES + 5)]
    assert stderr_excerpt(tail) == "\n".join(tail[5:])
    assert stderr_excerpt([]) == ""
