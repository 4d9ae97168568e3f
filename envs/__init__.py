"""Simulation: robots, terrain, physics backends, the locomotion task and the rsl_rl VecEnv."""
