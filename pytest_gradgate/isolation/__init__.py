"""Every case in its own process: the parent (Runner), the worker that forks a child per
case, the wire protocol between them, and the crash record. This is where a case dies."""
