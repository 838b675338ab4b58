"""interfaces layer (see DESIGN.md §3)."""
