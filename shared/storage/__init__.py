"""Where bytes live: S3 or local files behind one store, safe image decoding, the Parquet tables, annotated pictures."""
