"""Debugging aids: run-type comparison, dumps and the explain report."""
