"""Shims that let a real library run on this CPU machine: each module changes as little of the
real library as it can, says why, and is guarded by the release it was checked on."""
