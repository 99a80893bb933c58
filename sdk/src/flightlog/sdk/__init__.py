"""flightlog sdk."""
