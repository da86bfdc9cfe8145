"""The training side: readers and example types, features, the trainer, schedules, pretraining
data, evaluation (offline and against a live service) and the training CLI.

`python -m train ...` fine-tunes or pretrains (train/train.py: the command line, then the run);
`python -m train.evaluate ...` scores; `python -m train.recipes` retrains the default models
(train/recipes.py). `model/` (the network) never imports this package;
`export/` and `app/` never do either.
"""
