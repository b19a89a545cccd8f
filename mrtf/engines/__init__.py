"""Engines that drive the federated strategies outside the in-process simulator (Flower)."""
