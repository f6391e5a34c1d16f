"""Interaction helpers: loading the interaction config yaml."""
