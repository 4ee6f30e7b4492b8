"""The held path: turns held in memory until they finish, then published by one
script call (``finalise_held``)."""
