"""Benchmarks, each written to a report, and the cost model priced from them (with dated prices in data/)."""
