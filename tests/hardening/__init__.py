"""The hardening suite: the running server attacked the way an attacker, a buggy model and a bad day would."""
