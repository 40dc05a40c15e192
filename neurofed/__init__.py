"""neurofed: federated learning of spiking neural networks, from SLAYER training to Lava."""

__version__ = "0.2.0"  # the one place; pyproject.toml reads it; CHANGELOG.md says what changed
