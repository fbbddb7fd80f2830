"""The staged pipeline: stages, the runner that checkpoints them, and the run folder."""
