"""Serving logic: engine config, engine cores, the message server, the engine client."""
