"""What only a laptop or CI runs, never Lambda: the `annotate` command and what stands in for AWS around it."""
