"""Actor classes used by the runtime tests (imported by spawned actor processes)."""
