"""Test and benchmark harnesses: real node processes on loopback.

Rules of this package: it starts real `raftlog node` processes and waits on conditions with
deadlines (never a fixed sleep for state); nothing in raftlog/ imports it.
"""
