"""runtime layer (see DESIGN.md §3)."""
