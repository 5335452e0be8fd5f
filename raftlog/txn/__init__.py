"""Transaction coordinator (KIP-98, KIP-360, KIP-890 part 1) and `__transaction_state`."""
