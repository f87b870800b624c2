"""Failure, recovery, bad-input and security tests (real servers, real processes)."""
