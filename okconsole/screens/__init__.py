"""The console's screens, one module each."""
