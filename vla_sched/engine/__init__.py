"""The engine process: config, entry point, message server, client, the cores that serve steps."""
