"""Schema evolution, metadata and configuration (``SchemaMixin``).

Each call commits a new version through the copy-mutate-move pattern
(:meth:`DatasetCore.mutate`): the engine works on a private copy at the
latest version, on a worker thread, and this object moves to the version it
committed. A MemWAL writer opened before a schema change keeps the schema it
was opened with: close the writers, change the schema, reopen them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

import pyarrow as pa

from .._args import check_batch_size
from ..errors import SchemaMismatchError
from ._core import DatasetCore, engine_call

__all__ = ["SchemaMixin"]

D = TypeVar("D", bound="SchemaMixin")


def _names(columns: Sequence[str], what: str) -> list[str]:
    if isinstance(columns, str):
        raise TypeError(f"{what} takes a list of column names, not a string")
    names = list(columns)
    if not names:
        raise ValueError(f"{what} needs at least one column")
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"column names are str, got {type(name).__name__}")
    return names


def _string_map(values: Mapping[str, str | None], what: str) -> dict[str, str | None]:
    if not isinstance(values, Mapping):
        raise TypeError(f"{what} takes a dict of str to str (or None), got {type(values).__name__}")
    for key, value in values.items():
        if not isinstance(key, str) or not (value is None or isinstance(value, str)):
            raise TypeError(f"{what} takes a dict of str to str (or None): {key!r}: {value!r}")
    return dict(values)


class SchemaMixin(DatasetCore):
    """Columns, metadata and configuration of :class:`~lance_async.AsyncDataset`."""

    async def add_columns(
        self: D,
        transforms: Any,
        read_columns: Sequence[str] | None = None,
        reader_schema: Any = None,
        batch_size: int | None = None,
    ) -> D:
        """Add columns (``LanceDataset.add_columns`` on a worker thread); returns
        ``self`` at the new version.

        Parameters
        ----------
        transforms : dict, callable, reader, pa.Field, list of pa.Field or pa.Schema
            As pylance: ``{name: SQL expression}`` computed from existing
            columns; a batch UDF (``lance.batch_udf``, run on engine threads,
            so it must not touch the event loop); a reader of the new
            columns, one row per existing row; or fields, added as all-null
            columns without rewriting data.
        read_columns : list of str, optional
            Columns a UDF reads (default all).
        reader_schema : pa.Schema, optional
            The schema of a reader given as ``transforms``.
        batch_size : int, optional
            Rows per UDF call (>= 1).

        Raises
        ------
        ValueError, TypeError
            ``batch_size`` below 1 (at the call); pylance's own refusals of a
            transform (a column that exists already, a bad expression).
        ConflictError
            A concurrent commit conflicted.
        """
        if batch_size is not None:
            check_batch_size("batch_size", batch_size)
        cols = _names(read_columns, "read_columns") if read_columns is not None else None
        await self._mutate(
            lambda d: d.add_columns(
                transforms, read_columns=cols, reader_schema=reader_schema, batch_size=batch_size
            )
        )
        return self

    async def merge(
        self: D,
        data_obj: Any,
        left_on: str,
        right_on: str | None = None,
        schema: pa.Schema | None = None,
    ) -> D:
        """Add columns by joining rows on a column (``LanceDataset.merge``: a
        left join, the dataset on the left); returns ``self`` at the new version.

        Parameters
        ----------
        data_obj : pa.Table, reader, pandas frame, dataset or scanner
            The new columns and the join column, as pylance takes them (an
            :class:`AsyncDataset` too: its version now). Rows of the dataset
            without a match get nulls.
        left_on : str
            The dataset's join column.
        right_on : str, optional
            ``data_obj``'s join column (default ``left_on``).
        schema : pa.Schema, optional
            ``data_obj``'s schema, for a reader that has none.

        Raises
        ------
        TypeError
            A join column that is not a string (at the call).
        SchemaMismatchError
            ``left_on`` is not a column of the table, or ``right_on`` not one
            of a ``data_obj`` whose schema is known (before anything commits).
        ConflictError
            A concurrent commit conflicted.

        Notes
        -----
        ``add_columns`` with a reader, or ``merge_insert`` with a subset of
        the columns, do the same with a key instead of a join.
        """
        for name, value in (("left_on", left_on), ("right_on", right_on)):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{name} must be a column name, got {type(value).__name__}")
        if left_on not in self.schema.names:
            raise SchemaMismatchError(f"no column {left_on!r} in the table", field=left_on)
        source = data_obj.lance if isinstance(data_obj, DatasetCore) else data_obj
        known = getattr(source, "schema", None)
        join = right_on or left_on
        if isinstance(known, pa.Schema) and join not in known.names:
            raise SchemaMismatchError(f"no column {join!r} in the data to merge", field=join)
        await self._mutate(lambda d: d.merge(source, left_on, right_on=right_on, schema=schema))
        return self

    async def alter_columns(self: D, *alterations: Mapping[str, Any]) -> D:
        """Rename columns, change their nullability or cast them
        (``LanceDataset.alter_columns``); returns ``self`` at the new version.

        Parameters
        ----------
        *alterations : dict
            Each ``{"path": column, "name"?: new name, "nullable"?: bool,
            "data_type"?: pa.DataType}``, as pylance takes them.

        Raises
        ------
        ValueError, TypeError
            No alteration, or one that is not a dict with a ``path`` (at the
            call); pylance's refusals (an unknown column, a cast it cannot do).
        """
        if not alterations:
            raise ValueError("alter_columns needs at least one alteration")
        for alteration in alterations:
            if not isinstance(alteration, Mapping) or "path" not in alteration:
                raise TypeError(f"an alteration is a dict with a 'path' key, got {alteration!r}")
        changes: list[Any] = [dict(a) for a in alterations]
        await self._mutate(lambda d: d.alter_columns(*changes))
        return self

    async def drop_columns(self: D, columns: Sequence[str]) -> D:
        """Drop columns (``LanceDataset.drop_columns``; metadata only, no
        rewrite); returns ``self`` at the new version.

        Raises
        ------
        ValueError, TypeError
            No column, or ``columns`` given as one string (at the call).
        SchemaMismatchError
            A column is not in the table (nothing is dropped).
        """
        names = _names(columns, "drop_columns")
        unknown = [n for n in names if n.split(".", 1)[0] not in self.schema.names]
        if unknown:
            raise SchemaMismatchError(f"no column {unknown[0]!r} in the table", field=unknown[0])
        await self._mutate(lambda d: d.drop_columns(names))
        return self

    async def update_metadata(
        self, values: Mapping[str, str | None], *, replace: bool = False
    ) -> dict[str, str]:
        """Set (or, with a None value, remove) table metadata keys
        (``LanceDataset.update_metadata``); returns the metadata now in force.
        ``replace=True`` replaces it all."""
        checked = _string_map(values, "update_metadata")
        return dict(await self._mutate(lambda d: d.update_metadata(checked, replace=replace)))

    async def update_schema_metadata(
        self, values: Mapping[str, str | None], *, replace: bool = False
    ) -> dict[str, str]:
        """Set or remove schema metadata keys (``LanceDataset.update_schema_metadata``)."""
        checked = _string_map(values, "update_schema_metadata")
        return dict(
            await self._mutate(lambda d: d.update_schema_metadata(checked, replace=replace))
        )

    async def update_field_metadata(
        self, field_updates: Mapping[str, Mapping[str, str | None]], *, replace: bool = False
    ) -> None:
        """Set or remove metadata keys of fields, ``{field: {key: value}}``
        (``LanceDataset.update_field_metadata``)."""
        checked = {
            field: _string_map(values, "update_field_metadata")
            for field, values in field_updates.items()
        }
        await self._mutate(lambda d: d.update_field_metadata(checked, replace=replace))

    async def config(self) -> dict[str, str]:
        """The dataset's configuration keys (``LanceDataset.config``)."""
        return dict(await engine_call(self._ds.config))

    async def update_config(
        self, values: Mapping[str, str | None], *, replace: bool = False
    ) -> dict[str, str]:
        """Set or remove configuration keys (``LanceDataset.update_config``);
        returns the configuration now in force.

        lance_async keeps its own state in keys prefixed ``lance_async.``
        (retired MemWAL shards): leave them alone.
        """
        checked = _string_map(values, "update_config")
        return dict(await self._mutate(lambda d: d.update_config(checked, replace=replace)))

    async def delete_config_keys(self, keys: Iterable[str]) -> None:
        """Remove configuration keys (``LanceDataset.delete_config_keys``)."""
        names = _names(list(keys), "delete_config_keys")
        await self._mutate(lambda d: d.delete_config_keys(names))
