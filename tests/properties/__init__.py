"""Property-based tests: the broker state machine and the fuzzing of the public API."""
