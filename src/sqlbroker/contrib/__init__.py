"""contrib layer (see DESIGN.md §3)."""
