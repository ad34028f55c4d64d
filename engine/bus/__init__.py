"""Delivery physics per signal kind, over the store."""
