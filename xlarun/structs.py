"""Structs: classes of typed fields with the constructor, equality, representation and copies that
``dataclasses`` gives, at a fraction of its cost at import.

``@dataclass`` writes each class's methods as source text and compiles them when its module is imported:
about 0.5 ms a class on CPython 3.11 (five or six ``exec`` calls), 20 ms for the 40 classes a one-node
launch loads, where ``python -c pass`` takes 8 to 9 ms; ``dataclasses`` itself loads ``inspect`` and
``ast``. A struct's methods are shared code that reads the class's list of fields, made once from its
annotations when the class is created, and this module imports nothing.

Usage::

    class Seat(Struct, frozen=True):
        rank: int
        hosts: tuple[str, ...] = ()
        environ: Mapping[str, str] = field(default_factory=dict)

    seat = Seat(0)
    replace(seat, rank=1)      # Seat(rank=1, hosts=(), environ={})
    asdict(seat)               # {'rank': 0, 'hosts': (), 'environ': {}}

What it keeps of ``dataclasses``' behaviour: fields in the order of their annotations, a base struct's
first; ``__init__`` taking them positionally or by name, defaults and ``field(default_factory=...)``,
then ``__post_init__`` where the class has one; ``__repr__``; ``__eq__`` between instances of the same
class over the fields that compare (``field(compare=False)`` leaves one out), unless ``eq=False``;
``frozen=True`` refusing assignment with :class:`FrozenInstanceError` (an ``AttributeError``) and hashing
by value, a struct that compares and is not frozen having no hash. A method or
``__eq__`` the class defines itself wins, as with ``dataclasses``. Unlike ``dataclasses.asdict``,
:func:`asdict` leaves values that are not structs, lists, tuples or dicts as they are, without copying.
Type checkers read a struct as a dataclass (PEP 681, ``dataclass_transform``).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, ClassVar, TypeVar

    from typing_extensions import dataclass_transform  # typing's own from Python 3.11

    S = TypeVar("S", bound="Struct")
else:

    def dataclass_transform(**_options):
        """What type checkers read; nothing happens at run time."""
        return lambda cls: cls


_MISSING = object()


class FrozenInstanceError(AttributeError):
    """An assignment to a field of a frozen struct."""


class Field:
    """One field of a struct: its name, its default or the callable that makes one, whether ``==`` reads it."""

    __slots__ = ("name", "default", "default_factory", "compare")

    def __init__(self, default: Any = _MISSING, default_factory: Any = _MISSING, compare: bool = True):
        self.name = ""
        self.default = default
        self.default_factory = default_factory
        self.compare = compare

    @property
    def required(self) -> bool:
        return self.default is _MISSING and self.default_factory is _MISSING

    def initial(self) -> Any:
        return self.default if self.default_factory is _MISSING else self.default_factory()


def field(*, default: Any = _MISSING, default_factory: Callable[[], Any] | Any = _MISSING, compare: bool = True) -> Any:
    """A field's default, or the callable that makes a fresh one for each instance, and whether ``==`` reads it."""
    return Field(default, default_factory, compare)


def _equal(self: Struct, other: object) -> bool:
    if other.__class__ is not self.__class__:
        return NotImplemented
    # Tuples compare items by identity first, as dataclasses' __eq__ does (a NaN equals itself there).
    return tuple(getattr(self, name) for name in self._compared) == tuple(
        getattr(other, name) for name in self._compared
    )


def _hash(self: Struct) -> int:
    return hash(tuple(getattr(self, name) for name in self._compared))


def _refuse_assignment(self: Struct, name: str, value: object = None) -> None:
    raise FrozenInstanceError(f"cannot assign to field {name!r} of a frozen {type(self).__name__}")


@dataclass_transform(field_specifiers=(field,))
class Struct:
    """The base of every struct; ``frozen`` and ``eq`` are given as class keywords, as to ``@dataclass``."""

    _fields: ClassVar[tuple[Field, ...]] = ()
    _names: ClassVar[tuple[str, ...]] = ()
    _named: ClassVar[frozenset[str]] = frozenset()
    _optional: ClassVar[tuple[Field, ...]] = ()
    _compared: ClassVar[tuple[str, ...]] = ()
    _post_init: ClassVar[bool] = False

    def __init_subclass__(cls, *, frozen: bool = False, eq: bool = True, **options: Any) -> None:
        super().__init_subclass__(**options)
        found = {spec.name: spec for spec in cls._fields}
        for name, annotation in cls.__dict__.get("__annotations__", {}).items():
            if str(annotation).startswith(("ClassVar", "typing.ClassVar")):
                continue
            value = cls.__dict__.get(name, _MISSING)
            spec = value if isinstance(value, Field) else Field(default=value)
            spec.name = name
            if spec.default is _MISSING and name in cls.__dict__:
                delattr(cls, name)  # a factory's field: no class attribute to shadow it
            elif spec.default is not _MISSING:
                setattr(cls, name, spec.default)
            found[name] = spec  # a base's field given again keeps its place
        fields = tuple(found.values())
        for before, after in zip(fields, fields[1:], strict=False):
            if after.required and not before.required:
                raise TypeError(f"{cls.__name__}: field {after.name!r} has no default but follows {before.name!r}")
        cls._fields = fields
        cls._names = tuple(spec.name for spec in fields)
        cls._named = frozenset(cls._names)
        cls._optional = tuple(spec for spec in fields if not spec.required)
        cls._post_init = hasattr(cls, "__post_init__")
        cls._compared = tuple(spec.name for spec in fields if spec.compare)
        own = cls.__dict__
        if eq and "__eq__" not in own:
            cls.__eq__ = _equal  # type: ignore[assignment]
        if eq and "__hash__" not in own:
            cls.__hash__ = _hash if frozen else None  # type: ignore[assignment]
        if frozen:
            cls.__setattr__ = _refuse_assignment  # type: ignore[assignment]
            cls.__delattr__ = _refuse_assignment  # type: ignore[assignment]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        names = self._names
        if len(args) > len(names):
            raise TypeError(
                f"{type(self).__name__}() takes {len(names)} positional arguments but {len(args)} were given"
            )
        values = dict(zip(names, args, strict=False))  # args are no more than fields
        if kwargs:
            if not values.keys().isdisjoint(kwargs):
                twice = next(name for name in kwargs if name in values)
                raise TypeError(f"{type(self).__name__}() got multiple values for argument {twice!r}")
            if not self._named.issuperset(kwargs):
                unknown = next(name for name in kwargs if name not in self._named)
                raise TypeError(f"{type(self).__name__}() got an unexpected keyword argument {unknown!r}")
            values.update(kwargs)
        if len(values) < len(names):
            for spec in self._optional:
                if spec.name not in values:
                    values[spec.name] = spec.initial()
            if len(values) < len(names):
                missing = next(name for name in names if name not in values)
                raise TypeError(f"{type(self).__name__}() missing required argument {missing!r}")
        # Straight into the instance's dict: a frozen struct's __setattr__ refuses, as dataclasses' __init__ goes around it.
        self.__dict__.update(values)
        if self._post_init:
            getattr(self, "__post_init__")()  # noqa: B009 (a subclass's method, unknown to Struct)

    def __repr__(self) -> str:
        shown = ", ".join(f"{spec.name}={getattr(self, spec.name)!r}" for spec in self._fields)
        return f"{type(self).__qualname__}({shown})"


def fields(struct: Struct | type[Struct]) -> tuple[Field, ...]:
    """The fields of a struct or of its class, in order."""
    return struct._fields


def replace(struct: S, **changes: Any) -> S:
    """A copy of ``struct`` with ``changes``, made by its class's ``__init__`` (so ``__post_init__`` runs again)."""
    values = {spec.name: getattr(struct, spec.name) for spec in struct._fields}
    values.update(changes)
    return type(struct)(**values)


def asdict(struct: Struct) -> dict[str, Any]:
    """The struct's fields by name, structs within it (in lists, tuples and dicts too) turned into dicts."""
    return {spec.name: _plain(getattr(struct, spec.name)) for spec in struct._fields}


def _plain(value: Any) -> Any:
    if isinstance(value, Struct):
        return asdict(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple takes its items positionally
        return type(value)(*map(_plain, value))
    if isinstance(value, (list, tuple)):
        return type(value)(map(_plain, value))
    if isinstance(value, dict):
        return type(value)((_plain(key), _plain(item)) for key, item in value.items())
    return value
