"""Slurm host lists such as ``trn[001-004,010]`` or ``a[1-2]-b[3-4]``, read the way Slurm reads them.

Slurm hands every job its nodes in this compressed form (``SLURM_JOB_NODELIST``).
The rules below follow Slurm's documented node-range syntax and were checked
against ``scontrol show hostnames`` (Slurm 22.05):

- Names are separated by commas, spaces or tabs; a comma inside brackets belongs
  to the range list (``n[1,3]`` is one name pattern). Empty names are skipped.
- A bracket group holds comma-separated numbers and ``lo-hi`` ranges, in the
  order written (duplicates stay). A range keeps the width of its lower bound:
  ``n[08-11]`` gives n08 n09 n10 n11, ``n[8-011]`` gives n8 n9 n10 n11.
- A name may hold several groups (``rack[1-2]_n[01-02]``, ``n[1-2][3-4]``); the
  first group varies slowest. Text may sit before and between groups, but not
  after the last one: Slurm refuses ``unit[0-31]rack`` and so does this module.
- One range may name at most 65536 hosts, Slurm's own limit, and a host number has at most
  :data:`MAX_NUMBER_DIGITS` digits (leading zeros aside).

Where Slurm's C parser is lax by accident (``n[1-]``, spaces or signs inside
numbers, an unclosed ``[`` that it turns into an odd host name), these functions
raise UsageError instead of guessing.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

from xlarun.exceptions import UsageError
from xlarun.structs import Struct

MAX_HOSTS_PER_RANGE = 65536
MAX_NUMBER_DIGITS = 18
"""The most digits (leading zeros aside) of a number a scheduler gives: a host number, a job id, a node
count or rank. Each fits in 64 bits, as Slurm, Open MPI and Kubernetes hold them; a longer one is
refused as malformed before ``int()``, which reads no more than 4,300 digits, is asked to."""

_SEPARATORS = ", \t"
_RANGE = r"([0-9]+)(?:-([0-9]+))?"


class _Range(Struct, frozen=True):
    """Numbers ``lo..hi`` written zero-padded to ``width`` digits."""

    lo: int
    hi: int
    width: int

    def numbers(self) -> Iterator[str]:
        return (str(number).zfill(self.width) for number in range(self.lo, self.hi + 1))


# A name pattern is a sequence of literal text and bracket groups (tuples of ranges).
_Part = str | tuple[_Range, ...]
_Pattern = tuple[_Part, ...]


def expand_hostlist(text: str) -> list[str]:
    """Every host named by a Slurm host list, in Slurm's order; ``[]`` for an empty list.

    >>> expand_hostlist("trn[001-002,010],login")
    ['trn001', 'trn002', 'trn010', 'login']

    Raises UsageError when ``text`` is not a valid host list.
    """
    hosts: list[str] = []
    for pattern in _parse(text):
        choices = [(part,) if isinstance(part, str) else tuple(_group_numbers(part)) for part in pattern]
        hosts.extend("".join(combination) for combination in itertools.product(*choices))
    return hosts


def first_host(text: str) -> str:
    """The first host of a Slurm host list, without expanding the rest.

    The whole list is still checked, so a malformed list fails here as it does
    in expand_hostlist. Raises UsageError when ``text`` is malformed or names no host.
    """
    patterns = _parse(text)
    if not patterns:
        raise UsageError(f"host list {text!r} names no host")
    return "".join(part if isinstance(part, str) else next(part[0].numbers()) for part in patterns[0])


def too_long(digits: str) -> bool:
    """Whether a number written in ``digits`` has more than :data:`MAX_NUMBER_DIGITS` digits, leading zeros aside."""
    return len(digits.lstrip("0")) > MAX_NUMBER_DIGITS


def _group_numbers(group: tuple[_Range, ...]) -> Iterator[str]:
    for number_range in group:
        yield from number_range.numbers()


def _parse(text: str) -> list[_Pattern]:
    return [_parse_name(name) for name in _split_names(text)]


def _split_names(text: str) -> list[str]:
    """Cut ``text`` at separators that are not inside brackets."""
    names: list[str] = []
    current: list[str] = []
    inside_brackets = False
    for char in text:
        if char == "[":
            if inside_brackets:
                raise UsageError(f"host list {text!r} opens a '[' inside another; ranges do not nest")
            inside_brackets = True
        elif char == "]":
            if not inside_brackets:
                raise UsageError(f"host list {text!r} has a ']' without its '['")
            inside_brackets = False
        elif char in _SEPARATORS and not inside_brackets:
            if current:
                names.append("".join(current))
                current = []
            continue
        current.append(char)
    if inside_brackets:
        raise UsageError(f"host list {text!r} has a '[' that is never closed")
    if current:
        names.append("".join(current))
    return names


def _parse_name(name: str) -> _Pattern:
    """Split one name pattern into literal text and bracket groups; brackets are known to balance."""
    parts: list[_Part] = []
    position = 0
    while True:
        opening = name.find("[", position)
        if opening < 0:
            break
        if opening > position:
            parts.append(name[position:opening])
        closing = name.index("]", opening)
        parts.append(_parse_group(name[opening + 1 : closing], name))
        position = closing + 1
    rest = name[position:]
    if rest:
        if parts:
            raise UsageError(
                f"host name pattern {name!r} has text after its last range; Slurm requires a name"
                f" with ranges to end with one (write such hosts out, comma-separated)"
            )
        parts.append(rest)
    return tuple(parts)


def _parse_group(body: str, name: str) -> tuple[_Range, ...]:
    ranges = []
    for item in body.split(","):
        match = re.fullmatch(_RANGE, item)
        if match is None:
            raise UsageError(f"host name pattern {name!r}: {item!r} is not a number or a lo-hi range of digits")
        low_digits, high_digits = match.groups()
        for digits in (low_digits, high_digits or ""):
            if too_long(digits):
                raise UsageError(
                    f"a host number of {len(digits)} digits, more than {MAX_NUMBER_DIGITS}, in a range "
                    f"of the host name pattern starting {name[:24]!r}"
                )
        low = int(low_digits)
        high = low if high_digits is None else int(high_digits)
        if high < low:
            raise UsageError(f"host name pattern {name!r}: range {item!r} runs backwards")
        if high - low + 1 > MAX_HOSTS_PER_RANGE:
            raise UsageError(
                f"host name pattern {name!r}: range {item!r} names more than"
                f" {MAX_HOSTS_PER_RANGE} hosts, Slurm's limit for one range"
            )
        ranges.append(_Range(low, high, len(low_digits)))
    return tuple(ranges)
