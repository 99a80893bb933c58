"""flightlog daemon."""
