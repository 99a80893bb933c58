"""flightlog protocol."""
