"""A run directory's tables still open after the directory was moved or copied elsewhere.

The local Iceberg catalogue (SQLite) and each table's metadata record *absolute* locations: the catalogue
names the metadata file, the metadata its table's folder and manifest list, the manifests their data files.
Rewriting all of those after a move would mean new metadata, manifest lists and manifests for every table
(and a window in which a crash leaves some rewritten and some not). Instead the tables are read *in place*:

* :func:`recorded_roots` reads, from the catalogue, the tables folder each table was written under (its
  metadata location is ``ROOT/warehouse/NAMESPACE/TABLE/metadata/FILE``, so ``ROOT`` is exact, not guessed);
* where that folder is not the one the catalogue now lies in, the catalogue's file IO is
  :class:`RelocatedFileIO`, which reads (and, for a purge, deletes) every location under an old folder at the
  same place under the current one.

Nothing on disk changes, so opening a moved run is safe on a read-only copy and cannot be interrupted
half-way; a moved copy keeps working when moved again, and a new write goes to the current folder as always.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pyiceberg.catalog.sql import IcebergTables
from pyiceberg.io import InputFile, OutputFile
from pyiceberg.io.pyarrow import PyArrowFile, PyArrowFileIO
from pyiceberg.typedef import Properties
from sqlalchemy import select
from sqlalchemy.orm import Session

FROM_KEY = "genrec.relocated-from"
"""Catalogue property: a JSON list of the tables folders (as recorded) whose files now lie under TO_KEY."""
TO_KEY = "genrec.relocated-to"
"""Catalogue property: the tables folder the catalogue lies in now (a plain absolute path)."""


def _same_place(recorded: str, tables_dir: Path) -> bool:
    """Is ``recorded`` (a root as the catalogue spells it: a path or a ``file://`` URI) ``tables_dir``?"""
    return recorded in (str(tables_dir), f"file://{tables_dir}", tables_dir.as_uri())


def root_of(metadata_location: str, namespace: str, table: str) -> str | None:
    """The tables folder a table was written under, from its metadata location (None: not of that form)."""
    i = metadata_location.rfind(f"/warehouse/{namespace}/{table}/metadata/")
    return metadata_location[:i] if i > 0 else None


def recorded_roots(catalog: Any, tables_dir: Path) -> list[str]:
    """The tables folders other than ``tables_dir`` that the tables of ``catalog`` (a pyiceberg ``SqlCatalog``)
    were written under -- non-empty when the run directory was moved or copied since."""
    with Session(catalog.engine) as session:
        rows = session.execute(select(IcebergTables.table_namespace, IcebergTables.table_name,
                                      IcebergTables.metadata_location)
                               .where(IcebergTables.catalog_name == catalog.name)).all()
    roots = {root_of(loc, ns, name) for ns, name, loc in rows if loc}
    return sorted(r for r in roots if r is not None and not _same_place(r, tables_dir))


def relocation_properties(old_roots: list[str], tables_dir: Path) -> dict[str, str]:
    """Catalogue properties that read ``old_roots``' files under ``tables_dir`` (empty when none moved)."""
    if not old_roots:
        return {}
    return {"py-io-impl": f"{__name__}.RelocatedFileIO", FROM_KEY: json.dumps(old_roots), TO_KEY: str(tables_dir)}


def relocate(location: str, properties: Properties) -> str:
    """``location`` as it lies now: under the current tables folder when it was recorded under an old one."""
    raw = properties.get(FROM_KEY)
    if not raw:
        return location
    to = str(properties[TO_KEY])
    if location.startswith(to + "/"):
        return location
    for old in json.loads(raw):
        if location.startswith(old + "/"):
            return to + location[len(old):]
    return location


class RelocatedFileIO(PyArrowFileIO):
    """pyarrow file IO that finds a moved run's files at their new place (:func:`relocate`)."""

    def new_input(self, location: str) -> PyArrowFile:
        return super().new_input(relocate(location, self.properties))

    def new_output(self, location: str) -> PyArrowFile:
        return super().new_output(relocate(location, self.properties))

    def delete(self, location: str | InputFile | OutputFile) -> None:
        where = location.location if isinstance(location, (InputFile, OutputFile)) else location
        super().delete(relocate(where, self.properties))
