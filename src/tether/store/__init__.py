"""The local resource store: one SQLite file, apply/get/list/delete and watch with resource versions."""
