"""One process's part of the runtime: its :class:`~.runtime.Runtime` and the parts it is
built from (peers, calls, owned objects, frees, hosting, serial mode), object refs and
actor handles."""
