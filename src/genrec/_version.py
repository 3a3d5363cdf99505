"""The package version, in a module of its own: modules inside genrec import it from here, never from
the root package (whose lazy API imports the recipes, the top layer)."""

__version__ = "0.1.0"
