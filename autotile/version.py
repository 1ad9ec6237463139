"""The version of autotile (one place: the package and the commands read it)."""

__version__ = "0.1.0"
