"""Loads the shipped model catalog (server/data/models.json) and an operator's
overrides file, never from the network."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from server.domain.catalog import Catalog, parse_catalog


def load_catalog(override_path: str = "") -> Catalog:
    shipped = json.loads(resources.files("server").joinpath("data/models.json").read_text())
    catalog = Catalog(parse_catalog(shipped))
    if override_path:
        try:
            extra = parse_catalog(json.loads(Path(override_path).read_text()))
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read model catalog {override_path}: {exc}") from exc
        catalog = catalog.merged(extra)
    return catalog
