"""Jinja2 templates for the LLM (package data)."""
