"""Configure: profiles and options become one frozen config; server parameters and A/B blocks."""
