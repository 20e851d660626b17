"""Project configuration: the config folder, ``sources.yaml`` and where data lives."""
