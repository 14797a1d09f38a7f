"""The deployed stack, rehearsed on moto: see story.py."""
