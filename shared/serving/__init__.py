"""The synchronous side: the API (its OpenAI-compatible routes and the playground), the work of each call, and Label
Studio's ML backend."""
