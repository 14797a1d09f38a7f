"""What Lambda and Fargate run, every function and task alike. At this root: the typed boundaries (contracts), the
configuration (settings), errors, logs and metrics, and the detector's size arithmetic; the folders stack on them:
storage, then models, then the pipeline, then serving (docs/development.md draws the layers)."""
