"""Test harnesses shipped with the package: in-memory storage, faults, the simulation."""
