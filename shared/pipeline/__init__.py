"""The workflow's work: each state's step, one image through them, messages and S3 events into batches, the bulk lane's
worker and the Fargate entry points, and the ports a step receives."""
