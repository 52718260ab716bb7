"""Embedded demo models (demo-clip, demo-blip) shipped as package data; see their README.md."""
