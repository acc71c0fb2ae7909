"""xlarun.structs: a struct behaves as the dataclass of the same fields does, and loads nothing.

Each case builds the same class both ways and holds the struct to what ``dataclasses`` does.
"""

from __future__ import annotations

import dataclasses
import pickle
import subprocess
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
from helpers import REPO

from xlarun import structs
from xlarun.structs import FrozenInstanceError, Struct, field


class Seat(Struct, frozen=True):
    rank: int
    host: str = "localhost"
    ports: tuple[int, ...] = ()
    environ: tuple[str, ...] = field(default_factory=tuple)
    note: str = field(default="", compare=False)


@dataclasses.dataclass(frozen=True)
class SeatDataclass:
    rank: int
    host: str = "localhost"
    ports: tuple[int, ...] = ()
    environ: tuple[str, ...] = dataclasses.field(default_factory=tuple)
    note: str = dataclasses.field(default="", compare=False)


class Tally(Struct):
    count: int
    seen: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.double = self.count * 2


class Shared(Struct, eq=False):
    name: str


class Pair(NamedTuple):
    left: Seat
    right: int


class Nested(Struct, frozen=True):
    seats: list[Seat]
    by_name: dict[str, Seat]
    pair: Pair


CALLS: dict[str, Callable[[Any], Any]] = {
    "positional": lambda cls: cls(1, "h", (2,)),
    "by name": lambda cls: cls(rank=1, ports=(3,)),
    "mixed": lambda cls: cls(1, environ=("A=1",), note="x"),
}


@pytest.mark.parametrize("call", CALLS.values(), ids=CALLS.keys())
def test_construction_repr_equality_and_hash_match_the_dataclass(call: Callable[[Any], Any]) -> None:
    struct, data = call(Seat), call(SeatDataclass)
    assert repr(struct) == repr(data).replace("SeatDataclass", "Seat")
    assert structs.asdict(struct) == dataclasses.asdict(data)
    assert struct == call(Seat) and structs.replace(struct, note="other") == struct  # note does not compare
    assert struct != structs.replace(struct, rank=9) and struct != data
    assert hash(struct) == hash(structs.replace(call(Seat), note="other"))
    assert {struct, call(Seat)} == {struct}


REFUSED: dict[str, Callable[[type], Any]] = {
    "missing": lambda cls: cls(),
    "twice": lambda cls: cls(1, rank=2),
    "unknown": lambda cls: cls(1, colour="red"),
    "too many": lambda cls: cls(1, "h", (), {}, "", 6),
}


@pytest.mark.parametrize("call", REFUSED.values(), ids=REFUSED.keys())
def test_what_the_dataclass_refuses_the_struct_refuses(call: Callable[[type], Any]) -> None:
    with pytest.raises(TypeError):
        call(SeatDataclass)
    with pytest.raises(TypeError):
        call(Seat)


def test_a_frozen_struct_refuses_assignment_and_deletion_as_an_attribute_error() -> None:
    seat = Seat(0)
    with pytest.raises(FrozenInstanceError):
        seat.rank = 1  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del seat.host
    assert seat.rank == 0 and seat.host == "localhost"


def test_defaults_made_by_a_factory_are_fresh_and_post_init_runs_on_replace() -> None:
    first, second = Tally(1), Tally(1)
    first.seen.append(5)
    assert second.seen == [] and first.double == 2
    assert structs.replace(first, count=4).double == 8
    assert Tally.__hash__ is None  # compares and is not frozen: no hash, as a dataclass
    assert Shared("a") != Shared("a") and hash(Shared("a")) != 0  # eq=False: identity


def test_asdict_turns_structs_inside_lists_dicts_and_named_tuples_into_dicts() -> None:
    seat = Seat(1)
    nested = Nested([seat], {"a": seat}, Pair(seat, 2))
    plain = structs.asdict(nested)
    assert plain == {
        "seats": [structs.asdict(seat)],
        "by_name": {"a": structs.asdict(seat)},
        "pair": (plain["seats"][0], 2),
    }
    assert type(plain["pair"]) is Pair


def test_fields_come_in_order_with_their_names_and_a_struct_survives_pickling() -> None:
    assert [spec.name for spec in structs.fields(Seat)] == [spec.name for spec in dataclasses.fields(SeatDataclass)]
    seat = Seat(3, environ=("K=v",))
    assert pickle.loads(pickle.dumps(seat)) == seat


def test_a_required_field_after_a_default_is_refused_when_the_class_is_made() -> None:
    with pytest.raises(TypeError, match="'late' has no default but follows 'early'"):

        class Bad(Struct):
            early: int = 0
            late: int  # type: ignore[misc]


def test_the_module_loads_neither_typing_nor_dataclasses() -> None:
    code = "import sys, xlarun.structs; print(*sorted({'typing', 'dataclasses', 'inspect'} & set(sys.modules)))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert loaded.stdout.split() == []
