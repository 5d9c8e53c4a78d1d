"""ntpbench analysis: read results files (HDF5 schema 1), report, plot, and simulate goodput at
cluster scale. Run `python3 -m analysis --help`."""
from .runfile import Run, SchemaError, load_run  # noqa: F401

__version__ = "1.0"
