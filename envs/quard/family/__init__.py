"""The QUARD task families, one module each (``base.Family``); ``envs/quard/families.py`` registers them."""
