"""The results once written: SQL (DuckDB, Athena), the annotations a query selects, exports, evaluation, the gallery and
each batch's status."""
