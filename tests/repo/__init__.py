"""The repository itself: docs true of the code, claims named by test, the API reference, import
layers, package data."""
