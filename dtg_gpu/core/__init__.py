"""Helpers every layer uses: atomic files, parameter validation, devices, failure reports. Imports nothing above it."""
