"""Preprocessing: relational sources → a headwater database directory."""

from headwater.preprocessing.pipeline import preprocess
from headwater.preprocessing.schema import Schema, load_schema, parse_schema

__all__ = ["Schema", "load_schema", "parse_schema", "preprocess"]
