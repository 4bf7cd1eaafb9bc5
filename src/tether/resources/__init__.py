"""Typed models of the resources the mesh reads: parsing, validation with field paths, label selectors. Pure."""
