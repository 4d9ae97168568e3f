"""A model registered by a test, not by quadforge (``test_train_cli.py``): the history MLP under its own name."""
from quadforge.models.mlp import HistoryMLP


class LastStepNet(HistoryMLP):
    name = "laststep"
