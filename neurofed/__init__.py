"""neurofed: federated learning of spiking neural networks, from SLAYER training to Lava."""


def _version() -> str:
    """pyproject.toml's ``[project] version``, the one place it is defined: read from the
    file when neurofed runs from a checkout or a Flower app bundle (it sits beside the
    package there, and an editable install's metadata lags behind a changed version),
    else from the metadata of the installed distribution the wheel was built from."""
    from pathlib import Path

    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    if pyproject.is_file():
        import tomllib

        try:
            project = tomllib.loads(pyproject.read_text()).get("project", {})
        except (OSError, ValueError):
            project = {}
        if project.get("name") == "neurofed" and isinstance(project.get("version"), str):
            return project["version"]
    from importlib import metadata

    try:
        return metadata.version("neurofed")
    except metadata.PackageNotFoundError:
        return "0+unknown"


__version__ = _version()
