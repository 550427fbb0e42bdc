"""One process's part of the runtime: its :class:`~.runtime.Runtime` and the parts it is
built from (peers, calls, owned objects, frees, hosting, serial mode), each from the few
things it uses: the loop's thread (:mod:`.loop`), object stores (:mod:`.store`), object
refs, actor handles, and the scope of the hosted actor code running now (:mod:`.scope`)."""
