"""The peers the engine is compared against: raw claim loops (the ceilings) and procrastinate."""
