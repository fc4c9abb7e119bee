"""What the tests/test_bad_input_*.py files share."""

MAX_MESSAGE = 700  # every message stays short, whatever the input
