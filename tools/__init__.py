"""What only a laptop or CI runs, never Lambda: the deployment rehearsal (more tools move here, see README)."""
