"""spark layer (see DESIGN.md §3)."""
