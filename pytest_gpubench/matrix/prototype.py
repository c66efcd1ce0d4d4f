"""Many frozen pydantic instances from values validated already, without validating again.

A 10,000-cell matrix builds 10,000 :class:`~pytest_gpubench.matrix.cells.Cell` objects at
collection, all from parts the file's models checked; pydantic's validation (or
``model_construct``'s loop over the fields) for each would cost more than pytest
spends on the items. A :class:`Prototype` checks the field names once, for a
family of instances that share most of their values (a matrix row's cells), and
then builds each instance from a copy of one dictionary.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import cached_property
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)


class Prototype(Generic[M]):
    """Instances of ``model`` with the ``shared`` values and, for each, the ``varying`` ones.

    ``shared`` and ``varying`` together must name every field but those with a plain
    default (which they may still give); a field neither gives takes its default.
    Names of the model's ``cached_property`` attributes may be given too, when the
    caller knows their values already: they are stored as the property would store
    them. What :meth:`new` builds is what ``model_construct`` would (same ``__dict__``
    in field order, same fields set), for a model without private or extra attributes.

    For frozen models only, as the instances share one fields-set object: pydantic
    changes that set only on assignment, which a frozen model refuses (a copy takes
    its own), and it costs a kilobyte per instance, which a large matrix would keep
    for the whole run and the garbage collector walk again and again.
    """

    def __init__(self, model: type[M], shared: Mapping[str, Any], varying: Iterable[str]) -> None:
        fields = model.model_fields
        varying = frozenset(varying)
        given = shared.keys() | varying
        cached = {name for name in given - fields.keys() if isinstance(getattr(model, name, None), cached_property)}
        unknown = given - fields.keys() - cached
        missing = {name for name, field in fields.items()
                   if field.is_required() or field.default_factory is not None} - given
        config = model.model_config
        if unknown or missing or model.__private_attributes__ or config.get("extra") == "allow" \
                or not config.get("frozen"):
            raise TypeError(f"cannot build {model.__name__} from {sorted(given)}: unknown {sorted(unknown)}, "
                            f"missing {sorted(missing)} (or the model is not frozen, or has private or "
                            "extra attributes)")
        self._model = model
        # Field order, as validation would store them; the cached values after the fields.
        self._values = {name: shared.get(name, field.default) for name, field in fields.items()}
        self._values.update((name, shared[name]) for name in cached if name in shared)
        self._varying = varying
        self._fields_set = given & fields.keys()

    def new(self, **varying: Any) -> M:
        """An instance with the shared values and ``varying`` (exactly the names given at creation)."""
        if varying.keys() != self._varying:
            raise TypeError(f"{self._model.__name__}: expected {sorted(self._varying)}, got {sorted(varying)}")
        values = self._values.copy()
        values.update(varying)
        instance = self._model.__new__(self._model)
        object.__setattr__(instance, "__dict__", values)
        object.__setattr__(instance, "__pydantic_fields_set__", self._fields_set)
        object.__setattr__(instance, "__pydantic_extra__", None)
        object.__setattr__(instance, "__pydantic_private__", None)
        return instance
