"""One host's part of the runtime: a node starts actor processes (through its fork
server, or as fresh interpreters), watches them and reports their deaths; what it has
(resources) and the entry point of an actor process."""
