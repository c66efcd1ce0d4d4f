"""Many frozen pydantic instances from values validated already, without validating again:
the one adapter to pydantic's private names.

A 10,000-cell matrix builds 10,000 :class:`~pytest_gpubench.matrix.cells.Cell` objects at
collection, all from parts the file's models checked; pydantic's validation (or
``model_construct``'s loop over the fields) for each would cost more than pytest
spends on the items. A :class:`Prototype` checks the field names once, for a
family of instances that share most of their values (a matrix row's cells), and
then builds each instance from a copy of one dictionary.

pydantic has no public way to build an instance from values as they are and a shared
fields-set: ``model_construct`` loops over the fields (about 4x slower per cell) and
``model_copy(update=...)`` copies the fields-set (a kilobyte per cell, kept for the run).
So :func:`written` writes the instance's slots as ``model_construct`` itself does;
:data:`PRIVATE_NAMES` lists every pydantic private name this module touches, which
``tests/unit/test_private_names.py`` keeps out of every other module and
``tests/plugin/test_internals_contract.py`` checks against the installed pydantic.
Checked with the sources of pydantic 2.6.0, 2.13.0 and main (Aug 2026), whose
``BaseModel.__slots__`` and ``model_construct`` are the same there; pyproject.toml bounds
pydantic to ``>=2.6,<3``. On a pydantic whose ``BaseModel`` lacks one of those slots,
:func:`constructed` (``model_construct``: slower, the same instances) is used instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import cached_property
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)

#: Every private name of pydantic this module touches: the instance slots :func:`written`
#: writes, and the model's private-attribute table :class:`Prototype` reads (to refuse a model
#: that has private attributes, which :func:`written` would leave unset).
PRIVATE_NAMES = ("__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__", "__private_attributes__")
#: Whether this pydantic's ``BaseModel`` has the slots :func:`written` writes.
WRITES_SLOTS = set(PRIVATE_NAMES[:3]) <= set(getattr(BaseModel, "__slots__", ()))


def written(model: type[M], values: dict[str, Any], fields_set: set[str], _set: Any = object.__setattr__) -> M:
    """An instance of ``model`` whose ``__dict__`` is ``values`` (taken, not copied) and whose
    ``model_fields_set`` is ``fields_set`` (shared, not copied), nothing validated.

    What ``model_construct`` builds for a model without private or extra attributes, minus
    its loop over the fields: it writes the same slots (``__pydantic_fields_set__``,
    ``__pydantic_extra__``, ``__pydantic_private__``) the same way. Checked with pydantic
    2.6 to 2.13.
    """
    instance = model.__new__(model)
    _set(instance, "__dict__", values)
    _set(instance, "__pydantic_fields_set__", fields_set)
    _set(instance, "__pydantic_extra__", None)
    _set(instance, "__pydantic_private__", None)
    return instance


def constructed(model: type[M], values: dict[str, Any], fields_set: set[str]) -> M:
    """:func:`written`'s instance through pydantic's public ``model_construct``: about four
    times slower, and the cached values given in ``values`` are dropped (computed again
    when read). For a pydantic whose ``BaseModel`` lacks the slots :func:`written` writes."""
    return model.model_construct(fields_set, **values)


#: How :meth:`Prototype.new` builds an instance: chosen once, as the installed pydantic allows.
unvalidated = written if WRITES_SLOTS else constructed


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
        return unvalidated(self._model, values, self._fields_set)
