"""atheris harnesses for the payload codec and the topic/pattern parser (see README.md)."""
