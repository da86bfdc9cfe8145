"""`python -m train ...` is `python -m train.train ...`."""

from .train import cli

cli()
