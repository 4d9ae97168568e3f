"""QUARD-style vision-language tasks (seed 003 Table I): scenes, camera, instructions, rules, the env."""
