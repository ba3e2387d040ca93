"""Prompts and action tokens: the prompt builder and the action tokenizer and chunk decoder."""
