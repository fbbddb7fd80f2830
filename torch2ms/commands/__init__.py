"""One module per CLI command; each registers itself on ``torch2ms.cli_app.app``."""
