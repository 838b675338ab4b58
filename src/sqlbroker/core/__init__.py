"""Layer 0: pure domain logic with no I/O and no dependencies beyond the standard library."""
