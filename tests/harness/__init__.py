"""Test harness: real processes on free loopback ports, always stopped by PID."""
