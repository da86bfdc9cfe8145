"""`python -m train ...` runs train/train.py: the command line and the run, in one file."""

from .train import cli

cli()
