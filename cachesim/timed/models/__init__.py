"""Model presets (JSON: architecture dimensions) for the stall and bandwidth models."""
